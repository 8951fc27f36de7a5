"""``python -m bench checkpoints``: what trusting checkpoints costs.

The commit protocol's write (fsync, sha256 manifest, marker; and sizes only) against
``dd ... conv=fsync`` of the same size, ``verify_checkpoint``'s seconds per GB, and
upload/restore MB/s against a local moto S3 server; medians over ``--repeats``.
Figures: docs/results/2026-11-checkpoint-costs.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

from bench import costs
from bench.costs import progress, results_path, timed, write_results
from lazarus.domain.ports import free_port

CHUNK = 1 << 20


def add_command(commands: Any) -> None:
    parser = costs.add_parser(
        "checkpoints",
        commands,
        __doc__,
        help="checkpoint write, verification and S3 tiering costs",
    )
    parser.add_argument("--size-mb", type=int, default=512, help="checkpoint size (default 512)")
    parser.add_argument("--files", type=int, default=1, help="files the size is split into")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--dir", type=Path, default=Path(".lazarus/bench-checkpoints"), help="scratch (same disk)"
    )
    parser.add_argument("--part-size-mb", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--no-s3", action="store_true", help="skip the moto upload/restore")


def _dd(target: Path, size_mb: int) -> float:
    command = ["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={size_mb}", "conv=fsync"]
    seconds = timed(lambda: subprocess.run(command, check=True, capture_output=True))
    target.unlink()
    return seconds


def _write_checkpoint(root: Path, step: int, size_mb: int, files: int, hash_files: bool) -> Path:
    import lazarus.rank as lz

    lz.configure(checkpoint_dir=root)
    directory = lz.checkpoint_path(step)
    block = os.urandom(CHUNK)
    per_file = [size_mb // files + (1 if i < size_mb % files else 0) for i in range(files)]
    for index, mb in enumerate(per_file):
        with open(directory / f"shard-{index}.pt", "wb") as handle:
            for _ in range(mb):
                handle.write(block)
    lz.commit_checkpoint(step, hash_files=hash_files)
    return directory


@contextlib.contextmanager
def _moto_server() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the moto server did not start")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run(args: argparse.Namespace) -> int:
    from activities.checkpoints.verify import verify_checkpoint

    size_mb, repeats = args.size_mb, max(1, args.repeats)
    scratch: Path = args.dir.resolve() / f"run-{os.getpid()}"
    scratch.mkdir(parents=True, exist_ok=True)
    gb = size_mb * CHUNK / 1e9
    raw: dict[str, list[float]] = {
        k: []
        for k in (
            "dd_s",
            "commit_sha256_s",
            "commit_sizes_s",
            "verify_sha256_s",
            "verify_sizes_s",
            "upload_s",
            "restore_s",
        )
    }
    try:
        step = 0
        for repeat in range(repeats):
            progress(f"repeat {repeat + 1}/{repeats}: dd, commit, verify")
            raw["dd_s"].append(_dd(scratch / "dd.bin", size_mb))
            step += 1
            raw["commit_sizes_s"].append(
                timed(partial(_write_checkpoint, scratch / "ck", step, size_mb, args.files, False))
            )
            shutil.rmtree(scratch / "ck")
            step += 1
            directory = scratch / "ck" / f"step-{step:08d}"
            raw["commit_sha256_s"].append(
                timed(partial(_write_checkpoint, scratch / "ck", step, size_mb, args.files, True))
            )
            result = verify_checkpoint(directory)
            assert result.ok, result.problems
            raw["verify_sha256_s"].append(timed(partial(verify_checkpoint, directory)))
            raw["verify_sizes_s"].append(timed(partial(verify_checkpoint, directory, hashes=False)))
            if not args.no_s3:
                progress(f"repeat {repeat + 1}/{repeats}: upload to and restore from moto S3")
                _s3_round(directory, step, scratch, args, raw)
            shutil.rmtree(scratch / "ck")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    dd = statistics.median(raw["dd_s"])
    figures: dict[str, Any] = {
        "size_mb": size_mb,
        "files": args.files,
        "dd_MBps": size_mb / dd,
        "commit_sha256_MBps": size_mb / statistics.median(raw["commit_sha256_s"]),
        "commit_sizes_MBps": size_mb / statistics.median(raw["commit_sizes_s"]),
        "write_ratio_sha256": dd / statistics.median(raw["commit_sha256_s"]),
        "write_ratio_sizes": dd / statistics.median(raw["commit_sizes_s"]),
        "verify_sha256_s_per_GB": statistics.median(raw["verify_sha256_s"]) / gb,
        "verify_sizes_s_per_GB": statistics.median(raw["verify_sizes_s"]) / gb,
    }
    if raw["upload_s"]:
        figures["upload_MBps"] = size_mb / statistics.median(raw["upload_s"])
        figures["restore_MBps"] = size_mb / statistics.median(raw["restore_s"])
    payload = {
        "benchmark": "checkpoints",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {
            "size_mb": size_mb,
            "files": args.files,
            "repeats": repeats,
            "dir": str(args.dir.resolve()),
            "part_size_mb": args.part_size_mb,
            "concurrency": args.concurrency,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg": os.getloadavg(),
        },
        "figures": figures,
        "raw_seconds": raw,
    }
    out = results_path("checkpoints", args.json_out)
    write_results(out, payload, markdown(figures, repeats))
    return 0


def _s3_round(
    directory: Path, step: int, scratch: Path, args: argparse.Namespace, raw: dict[str, list[float]]
) -> None:
    import boto3

    from activities.checkpoints import restore_checkpoint_sync, upload_checkpoint_sync
    from activities.checkpoints.tiering import UploadTracker
    from lazarus.domain.contracts import (
        CheckpointRef,
        RestoreCheckpointRequest,
        UploadCheckpointRequest,
    )
    from lazarus.domain.spec import CheckpointsSpec

    env = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    # The credentials for this round only: os.environ is as it was afterwards.
    with mock.patch.dict(os.environ, env), _moto_server() as endpoint:
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        spec = CheckpointsSpec(
            durable_uri="s3://bench/ck",
            endpoint_url=endpoint,
            upload_part_size_mb=args.part_size_mb,
            upload_concurrency=args.concurrency,
        )
        request = UploadCheckpointRequest(
            checkpoint=CheckpointRef(step=step, path=str(directory)), checkpoints=spec
        )
        tracker = UploadTracker(step, f"s3://bench/ck/{directory.name}")
        started = time.perf_counter()
        result = upload_checkpoint_sync(request, tracker)
        raw["upload_s"].append(time.perf_counter() - started)
        assert result.verified
        restore = RestoreCheckpointRequest(
            uri=result.uri, checkpoint_dir=str(scratch / "restored"), checkpoints=spec
        )
        raw["restore_s"].append(timed(lambda: restore_checkpoint_sync(restore)))
        shutil.rmtree(scratch / "restored")


def markdown(figures: dict[str, Any], repeats: int) -> str:
    rows = [
        ("raw write, `dd bs=1M conv=fsync`", f"{figures['dd_MBps']:.0f} MB/s", "1.00"),
        (
            "checkpoint write + commit (fsync, sha256 manifest, marker)",
            f"{figures['commit_sha256_MBps']:.0f} MB/s",
            f"{figures['write_ratio_sha256']:.2f}",
        ),
        (
            "checkpoint write + commit, sizes only (`hash_files=False`)",
            f"{figures['commit_sizes_MBps']:.0f} MB/s",
            f"{figures['write_ratio_sizes']:.2f}",
        ),
        ("verify, sha256", f"{figures['verify_sha256_s_per_GB']:.2f} s/GB", ""),
        ("verify, sizes only", f"{figures['verify_sizes_s_per_GB'] * 1000:.2f} ms/GB", ""),
    ]
    if "upload_MBps" in figures:
        rows.append(
            ("upload to moto S3 (verify local, multipart, verify remote)",
             f"{figures['upload_MBps']:.0f} MB/s", "")
        )  # fmt: skip
        rows.append(("restore from moto S3 (download, sha256 verify, rename)",
                     f"{figures['restore_MBps']:.0f} MB/s", ""))  # fmt: skip
    lines = [
        f"checkpoint of {figures['size_mb']} MB in {figures['files']} file(s), median of {repeats}",
        "",
        *costs.table(["measure", "result", "vs dd"], rows, ["---", "---:", "---:"]),
    ]
    return "\n".join(lines)
