"""Issue 37, N8: a DCP resume point cannot run code in the ranks that load it.

``torch.distributed.checkpoint``'s own reader unpickles ``.metadata`` with plain
``pickle.load``, and its planner reads non-tensor values with
``torch.load(weights_only=False)``: whoever can write the checkpoint directory (or the
durable bucket a restore copies from) ran code in every rank of a job that called
``load_sharded``. Each test plants a payload that would write a marker file, in a real
checkpoint sealed by ``save_sharded``, and checks the marker never appears."""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

import lazarus.rank as lz
from lazarus.rank import reset
from lazarus.rank.dcp import MetadataUnpickler, UntrustedCheckpoint, load_sharded, save_sharded
from tests.checkpoint_helpers import clean_rank_env

pytestmark = [
    pytest.mark.usefixtures("clean_rank_env"),
    pytest.mark.timeout(30),
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]
__all__ = ["clean_rank_env"]


class Payload:
    """Unpickled, it writes ``marker``: the stand-in for any code a forged file runs."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def _save(root: Path, step: int, state: dict[str, Any]) -> Path:
    reset._reset_state()
    lz.configure(checkpoint_dir=root)
    directory = save_sharded(step, state)
    assert directory is not None
    reset._reset_state()
    lz.configure(checkpoint_dir=root)
    return directory


def _why(exc: CheckpointException) -> str:
    """The rank's own error inside DCP's wrapper (one per rank, with its traceback)."""
    return " ".join(f"{failure!r} {failure}" for failure in exc.failures.values())


def _state() -> dict[str, Any]:
    return {"w": torch.arange(6.0).reshape(3, 2), "step": 7, "lr": [0.1, 0.01]}


def test_a_forged_metadata_runs_nothing_and_is_refused(tmp_path: Path) -> None:
    directory = _save(tmp_path, 10, _state())
    marker = tmp_path / "code-ran"
    (directory / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(CheckpointException) as refused:
        load_sharded({"w": torch.zeros(3, 2), "step": 0, "lr": [0.0, 0.0]})
    assert not marker.exists(), f"the checkpoint ran code: {refused.value}"
    assert "may hold only DCP's metadata, not builtins.exec" in _why(refused.value)


def test_a_forged_plain_value_runs_nothing_and_is_refused(tmp_path: Path) -> None:
    """The other way in: a non-tensor value of the state dict, read back by DCP's
    planner with ``weights_only=False``."""
    marker = tmp_path / "code-ran"
    _save(tmp_path, 10, {"w": torch.ones(2), "extra": Payload(marker)})
    assert not marker.exists(), "the save itself runs nothing"
    with pytest.raises(CheckpointException) as refused:
        load_sharded({"w": torch.zeros(2), "extra": None})
    assert not marker.exists(), f"the checkpoint ran code: {refused.value}"
    assert "extra: not a plain value" in _why(refused.value)


def test_an_honest_checkpoint_still_loads_with_its_plain_values(tmp_path: Path) -> None:
    _save(tmp_path, 10, _state())
    target: dict[str, Any] = {"w": torch.zeros(3, 2), "step": 0, "lr": [0.0, 0.0]}
    assert load_sharded(target) == 10
    assert torch.equal(target["w"], _state()["w"])
    assert target["step"] == 7 and target["lr"] == [0.1, 0.01]


def test_the_unpickler_builds_dcp_metadata_and_nothing_else(tmp_path: Path) -> None:
    directory = _save(tmp_path, 10, {"w": torch.ones(2, dtype=torch.bfloat16)})
    with (directory / ".metadata").open("rb") as stream:
        metadata = MetadataUnpickler(stream).load()
    assert type(metadata).__name__ == "Metadata" and "w" in metadata.state_dict_metadata
    for forged in (pickle.dumps(Payload(tmp_path / "x")), b"cos\nsystem\n(S'true'\ntR."):
        with pytest.raises(UntrustedCheckpoint, match="may hold only DCP's metadata"):
            MetadataUnpickler(io.BytesIO(forged)).load()
