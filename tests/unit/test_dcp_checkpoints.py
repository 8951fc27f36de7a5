"""The ledger on DCP directories: a real ``torch.distributed.checkpoint`` save
(``.metadata`` plus ``__N_M.distcp`` shards) sealed by ``save_sharded`` verifies,
loads back through ``load_sharded``, and a missing or torn shard makes the search
fall back to an earlier step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import lazarus.rank as lz
from activities.checkpoints import search_verified, verify_checkpoint
from lazarus.domain.contracts import FindVerifiedCheckpointRequest
from lazarus.rank import reset
from lazarus.rank.dcp import load_sharded, save_sharded
from tests.checkpoint_helpers import clean_rank_env, flip_byte

pytestmark = [
    pytest.mark.usefixtures("clean_rank_env"),
    pytest.mark.timeout(30),
    # One process, no process group: DCP says so, and that is the case tested here.
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]
__all__ = ["clean_rank_env"]


def _state(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(8, 4, generator=generator), "b": torch.randn(4, generator=generator)}


def _save(root: Path, step: int) -> Path:
    reset._reset_state()
    lz.configure(checkpoint_dir=root)
    directory = save_sharded(step, _state(step))
    assert directory is not None
    reset._reset_state()
    return directory


def _shards(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.distcp"))


def test_a_dcp_checkpoint_is_in_the_manifest_and_verifies(tmp_path: Path) -> None:
    directory = _save(tmp_path, 10)
    assert (directory / ".metadata").is_file() and _shards(directory)
    result = verify_checkpoint(directory)
    assert result.ok, result.problems
    assert result.files == 1 + len(_shards(directory))


def test_load_sharded_restores_the_saved_tensors(tmp_path: Path) -> None:
    _save(tmp_path, 10)
    reset._reset_state()
    lz.configure(checkpoint_dir=tmp_path)
    target = {key: torch.zeros_like(value) for key, value in _state(0).items()}
    assert load_sharded(target) == 10
    for key, value in _state(10).items():
        assert torch.equal(target[key], value)


def test_a_missing_or_torn_shard_falls_back(tmp_path: Path) -> None:
    _save(tmp_path, 10)
    missing = _save(tmp_path, 20)
    _shards(missing)[0].unlink()
    torn = _save(tmp_path, 30)
    flip_byte(_shards(torn)[0], offset=10)
    no_metadata = _save(tmp_path, 40)
    (no_metadata / ".metadata").unlink()
    found = search_verified(FindVerifiedCheckpointRequest(checkpoint_dir=str(tmp_path)))
    assert found.chosen is not None and found.chosen.step == 10
    assert [s.step for s in found.skipped] == [40, 30, 20]
    assert any(".metadata" in p for p in found.skipped[0].problems)
    assert any("sha256 mismatch" in p for p in found.skipped[1].problems)
    assert any(".distcp" in p for p in found.skipped[2].problems)
