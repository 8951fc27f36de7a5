"""The state ``setup`` built, kept by ``run_resilient`` only when it may be needed again."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from lazarus.rank.train_state import InitialState as _InitialState  # noqa: E402


def _state() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    return {"model": torch.nn.Linear(4, 4)}


def test_a_fresh_first_generation_keeps_a_copy_a_later_fresh_start_restores() -> None:
    state = _state()
    built = state["model"].weight.detach().clone()
    initial = _InitialState()
    initial.after_load(state, resumed=False)
    with torch.no_grad():
        state["model"].weight.add_(1.0)  # trained on
    initial.restore_into(state)
    assert torch.equal(state["model"].weight, built)


def test_a_process_that_began_from_a_checkpoint_copies_nothing_and_refuses_a_fresh_start() -> None:
    state = _state()
    initial = _InitialState()
    initial.after_load(state, resumed=True)
    assert initial.saved is None  # no second copy of the state on a replacement's path
    initial.after_load(state, resumed=False)  # a later generation: still no copy
    assert initial.saved is None
    with pytest.raises(RuntimeError, match="began from a checkpoint"):
        initial.restore_into(state)
