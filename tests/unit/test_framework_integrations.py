"""The framework-free half of lazarus.rank.integrations (ledger.py): fast, no framework."""

from __future__ import annotations

from pathlib import Path

import pytest

import lazarus.rank as lz
from lazarus.domain import environment
from lazarus.rank.integrations.ledger import loss_of, move_into, resume_file


def test_loss_of_reads_a_number_a_tensor_or_a_mapping() -> None:
    torch = pytest.importorskip("torch")
    assert loss_of(0.5) == 0.5
    assert loss_of(torch.tensor(0.25)) == 0.25
    assert loss_of({"loss": torch.tensor(2.0), "other": 1}) == 2.0
    assert loss_of({"logits": 1}) is None
    assert loss_of(None) is None
    assert loss_of(torch.ones(3)) is None


def test_move_into_renames_every_entry_and_replaces_a_resave(tmp_path: Path) -> None:
    source, target = tmp_path / "checkpoint-5", tmp_path / "step-00000005"
    (source / "nested").mkdir(parents=True)
    (source / "model.safetensors").write_text("new")
    (source / "nested" / "rng.pth").write_text("rng")
    target.mkdir()
    (target / "model.safetensors").write_text("old")
    move_into(source, target)
    assert not source.exists()
    assert (target / "model.safetensors").read_text() == "new"
    assert (target / "nested" / "rng.pth").read_text() == "rng"


def test_resume_file_names_the_chosen_step_or_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (environment.RESUME_FROM, environment.RESUME_STEP, environment.JOB_ID):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(environment.CHECKPOINT_DIR, str(tmp_path))
    assert resume_file("lightning.ckpt") is None
    monkeypatch.setenv(environment.RESUME_FROM, str(tmp_path / "step-00000010"))
    assert resume_file("lightning.ckpt") == str(tmp_path / "step-00000010" / "lightning.ckpt")
    assert resume_file() == str(tmp_path / "step-00000010")
    assert lz.resume_step() == 10
