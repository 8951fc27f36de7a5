"""Node-side verbs run in a fork of the run's zygote (``activities.nodes.zygote_socket``):
the relay of a carry or a warm start gets the verb's own answer from a process that
had its imports done, and falls back to running the verb itself wherever the zygote runs nothing.
Real zygotes; each test stops its own."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from activities.nodes import zygote_client
from activities.nodes.zygote import VERBS
from activities.nodes.zygote_socket import run_in_zygote

pytestmark = pytest.mark.timeout(120)


@contextmanager
def _serving(run_dir: Path, verbs: bool) -> Iterator[Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAZARUS_")}
    zygote_client.start_zygote(run_dir, ("json",), 0, env=env, verbs=verbs)
    try:
        zygote_client.wait_serving(run_dir, 90)
        yield run_dir
    finally:
        zygote_client.stop_zygote(run_dir)


@pytest.fixture
def zygote(tmp_path: Path) -> Iterator[Path]:
    """A zygote as the shim starts one on an ssh or Slurm node (``--verbs``)."""
    with _serving(tmp_path / ".zygote-n", verbs=True) as run_dir:
        yield run_dir


@pytest.mark.parametrize(("verb", "said"), [("carry", "rejoin"), ("warm", "warm")])
def test_a_verb_runs_in_a_fork_of_a_serving_zygote(zygote: Path, verb: str, said: str) -> None:
    info = zygote_client.live_zygote(zygote)
    loaded = info.preload_results[f"activities.nodes.{verb}"]
    assert loaded.ok and loaded.optional  # a verb that will not import refuses nothing

    out = io.BytesIO()
    assert run_in_zygote(zygote, verb, b'{"ranks": "none"}', out)

    (line,) = out.getvalue().splitlines()
    error = json.loads(line)["error"]
    assert error.startswith(f"{said}: bad request on stdin: ") and "none" not in error
    assert zygote_client.zygote_status(zygote).state == "serving"
    deadline = time.monotonic() + 10  # the loop reaps its verb's fork
    while _children(info.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _children(info.pid) == []


def test_nothing_runs_where_the_zygote_cannot_run_it(zygote: Path, tmp_path: Path) -> None:
    out = io.BytesIO()
    assert not run_in_zygote(zygote, "no-such-verb", b"{}", out)
    assert not run_in_zygote(tmp_path / "nowhere", "carry", b"{}", out)
    assert not run_in_zygote(zygote, "carry", b"\xff not text", out)
    assert out.getvalue() == b""


def test_a_local_nodes_zygote_imports_no_verb_and_runs_none(tmp_path: Path) -> None:
    """A local node's agent runs the verbs in the worker: its zygote, and so every rank
    forked from it, never imports them."""
    with _serving(tmp_path / ".zygote-local", verbs=False) as run_dir:
        info = zygote_client.live_zygote(run_dir)
        assert not any(name in info.preload_results for name in VERBS.values())
        out = io.BytesIO()
        assert not run_in_zygote(run_dir, "carry", b'{"ranks": "none"}', out)
        assert out.getvalue() == b""


def test_the_carry_falls_back_to_its_own_process_without_a_zygote(tmp_path: Path) -> None:
    request = {"run_root": str(tmp_path), "node": "n", "ranks": "none"}
    done = subprocess.run(
        [sys.executable, "-m", "activities.nodes.carry"],
        input=json.dumps(request).encode(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert json.loads(done.stdout)["error"].startswith("rejoin: bad request on stdin: ")


def _children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    return [int(c) for t in tasks.iterdir() for c in (t / "children").read_text().split()]
