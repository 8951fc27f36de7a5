"""A state dict to one file: the snapshot's digest computed while it is written."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch
from torch.utils.serialization import config as serialization_config

from lazarus.rank import transfer
from lazarus.rank.state_file import save_checkpoint_file, save_snapshot_file


@pytest.mark.parametrize(
    "writes",
    [
        [b""],
        [b"x"],
        [b"a" * 10, b"b" * (transfer.CHUNK - 10), b"c"],  # fills a chunk from small writes
        [b"p" * 7, b"q" * (2 * transfer.CHUNK + 5), b"r" * 3],  # a large write off-boundary
        [b"s" * transfer.CHUNK] * 3,
    ],
)
def test_the_digest_is_the_receivers(tmp_path: Path, writes: list[bytes]) -> None:
    """Whatever the pattern of writes, the digest is the one a receiver computes from
    the bytes on disk (chunks at their file offsets), so a push may send it unread."""
    target = tmp_path / "f"
    with open(target, "wb", buffering=0) as handle:
        writer = transfer.DigestingWriter(handle)
        for data in writes:
            assert writer.write(data) == len(data)
        digest = writer.digest()
    assert target.read_bytes() == b"".join(writes)
    assert digest == transfer.digest_of(target)


def test_a_snapshot_loads_and_its_digest_matches(tmp_path: Path) -> None:
    state = {"w": torch.arange(3_000_000, dtype=torch.int32), "step": 7}
    target = tmp_path / "state.pt"
    digest = save_snapshot_file(state, target)
    assert digest == transfer.digest_of(target)
    loaded = torch.load(target, weights_only=True)
    assert torch.equal(loaded["w"], state["w"]) and loaded["step"] == 7
    assert not list(tmp_path.glob("*.tmp*")), "no temp file left"


def test_only_the_snapshot_drops_the_zip_crc(tmp_path: Path) -> None:
    """The process-wide CRC switch is restored after a snapshot; a disk checkpoint
    keeps its CRCs (a reader years later may check them)."""
    assert serialization_config.save.compute_crc32
    save_snapshot_file({"w": torch.ones(4)}, tmp_path / "snap.pt")
    assert serialization_config.save.compute_crc32
    save_checkpoint_file({"w": torch.ones(4)}, tmp_path / "ckpt.pt")
    data = [i for i in _records(tmp_path / "ckpt.pt") if i.filename.endswith("/data/0")]
    assert data and data[0].CRC != 0
    snap = [i for i in _records(tmp_path / "snap.pt") if i.filename.endswith("/data/0")]
    assert snap and snap[0].CRC == 0


def _records(path: Path) -> list[zipfile.ZipInfo]:
    with zipfile.ZipFile(path) as archive:
        return archive.infolist()


def test_a_failed_save_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "state.pt"
    with pytest.raises(Exception):  # noqa: B017 - whatever pickle raises
        save_snapshot_file({"bad": lambda: None}, target)
    assert list(tmp_path.iterdir()) == []
