"""The helper's own loop resumes at the exact next batch (issue 37): the example's
``StatefulDataLoader`` state, saved with a checkpoint at any step, gives a restored
loader the batches the uninterrupted loop went on with, in each epoch's order.

Fast and in one process (``examples/train_ddp.py``'s ``data_loader`` and ``epochs``,
rank 0 of 2); the kill and resume under Lazarus is ``tests/e2e/test_frameworks.py``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torchdata")
torch = pytest.importorskip("torch")

from examples import train_ddp  # noqa: E402  (after the skips: it imports torch)

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")
"""torchdata 0.11.0 calls ``torch.set_vital``, which torch 2.13 deprecates: not ours."""
EPOCH_BATCHES = 4
STEPS = 14


@pytest.fixture(autouse=True)
def rank_0_of_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")


def loader() -> Any:
    return train_ddp.data_loader(argparse.Namespace(seed=3, epoch_batches=EPOCH_BATCHES))


def fingerprints(batches: Iterator[tuple[Any, ...]], count: int) -> list[list[float]]:
    return [next(batches)[0].sum(dim=1).tolist() for _ in range(count)]


def run_saving_at(step: int) -> tuple[list[list[float]], dict[str, Any]]:
    """The uninterrupted loop's batches, and the loader's state after ``step`` steps."""
    data = loader()
    batches = train_ddp.epochs(data, 0)
    seen = fingerprints(batches, step)
    saved = data.state_dict()
    return seen + fingerprints(batches, STEPS - step), saved


@pytest.mark.parametrize("step", [1, 5, EPOCH_BATCHES, 2 * EPOCH_BATCHES, 2 * EPOCH_BATCHES + 3])
def test_a_restored_loader_goes_on_at_the_next_batch(step: int) -> None:
    """Mid-epoch and at an epoch's end (an empty pass, then the next epoch)."""
    uninterrupted, saved = run_saving_at(step)
    restored = loader()
    restored.load_state_dict(saved)
    assert fingerprints(train_ddp.epochs(restored, step), STEPS - step) == uninterrupted[step:]


def test_a_rejoined_process_reloads_its_own_live_loader() -> None:
    """Under ``run_resilient`` a survivor loads the checkpoint into the loader it was
    iterating: the saved position wins over the live one."""
    uninterrupted, saved = run_saving_at(6)
    live = loader()
    fingerprints(train_ddp.epochs(live, 0), 9)  # went on past the checkpoint, then failed
    live.load_state_dict(saved)
    assert fingerprints(train_ddp.epochs(live, 6), STEPS - 6) == uninterrupted[6:]


def test_each_epoch_is_drawn_anew() -> None:
    """The sampler shuffles by epoch, so the tests above compare orders that matter."""
    batches = fingerprints(train_ddp.epochs(loader(), 0), 2 * EPOCH_BATCHES)
    assert batches[:EPOCH_BATCHES] != batches[EPOCH_BATCHES:]
