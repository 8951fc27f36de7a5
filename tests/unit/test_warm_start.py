"""warm_start in the spec, the command mapping and the end-of-run path guards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from activities.nodes.local.agent import remove_memory_dir
from activities.nodes.shim_calls import SHIM_PATH
from activities.nodes.warm_starts import PER_RANK_ENV, warm_argv, zygote_environment
from activities.nodes.zygote_client import ZygoteUnavailable
from lazarus.domain.memory_tier import on_node
from lazarus.domain.spec import SpecError, parse_spec
from lazarus.rank.memory import secure

BASE = {"name": "w", "command": ["python", "train.py"]}


def test_warm_start_is_off_unless_the_section_is_present_and_enabled() -> None:
    assert parse_spec(BASE, "<t>").warm is None
    on = parse_spec({**BASE, "warm_start": {"preload": ["torch"], "standby": 2}}, "<t>")
    assert on.warm is not None and on.warm.preload == ["torch"] and on.warm.standby == 2
    assert parse_spec({**BASE, "warm_start": {}}, "<t>").warm.preload == ["torch"]  # type: ignore[union-attr]
    assert parse_spec({**BASE, "warm_start": {"enabled": False}}, "<t>").warm is None


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ({"preload": ["no such"]}, "warm_start.preload: 'no such' is not a module name"),
        ({"preload": ["torch", "torch"]}, "warm_start.preload: torch listed more than once"),
        ({"preload": ["a,b"]}, "is not a module name"),
        ({"standby": 9}, "warm_start.standby: must be at most 8; got 9"),
        ({"standby": -1}, "warm_start.standby: must be at least 0; got -1"),
        ({"stanby": 1}, "warm_start.stanby: unknown field"),
    ],
)
def test_bad_warm_start_sections_name_the_field(section: dict[str, object], expected: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec({**BASE, "warm_start": section}, "<t>")
    assert any(expected in line for line in caught.value.lines), caught.value.lines


def test_python_on_the_workers_path_maps_to_the_workers_interpreter() -> None:
    path = f"{Path(sys.executable).parent}{os.pathsep}/usr/bin"
    argv = warm_argv(["python", "-u", "train.py", "--x"], {"PATH": path}, "/")
    assert argv == [os.path.abspath(sys.executable), "-u", "train.py", "--x"]
    assert warm_argv([sys.executable, "t.py"], {}, "/")[0] == os.path.abspath(sys.executable)


def test_other_programs_start_cold_with_a_reason(tmp_path: Path) -> None:
    with pytest.raises(ZygoteUnavailable, match="not the worker's interpreter"):
        warm_argv(["/bin/sh", "-c", "true"], {}, "/")
    other = tmp_path / "python"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    with pytest.raises(ZygoteUnavailable, match="not the worker's interpreter"):
        warm_argv(["python", "t.py"], {"PATH": str(tmp_path)}, "/")
    with pytest.raises(ZygoteUnavailable, match="not on the ranks' PATH"):
        warm_argv(["python", "t.py"], {"PATH": str(tmp_path / "none")}, "/")


def test_the_zygote_gets_the_shared_environment_only() -> None:
    env = {name: "x" for name in PER_RANK_ENV} | {"PYTHONPATH": "/p", "OMP_NUM_THREADS": "1"}
    assert zygote_environment(env) == {"PYTHONPATH": "/p", "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize(
    "path", ["/dev/shm/lazarus", "/dev/shm/lazarus/../x", "/tmp/x", "/dev/shm/lazarusx/a"]
)
@pytest.mark.slow  # runs the node shim
def test_memory_tier_removal_refuses_paths_outside_the_tier(path: str) -> None:
    with pytest.raises(ValueError, match="refusing to remove"):
        remove_memory_dir(path)
    reply = subprocess.run(
        ["sh", str(SHIM_PATH), "end-run", path], capture_output=True, text=True, timeout=10
    )
    assert reply.returncode != 0 and "refusing to remove" in reply.stdout


@pytest.mark.slow  # runs the node shim
def test_memory_tier_removal_is_idempotent(tmp_path: Path) -> None:
    logical = f"/dev/shm/lazarus/unit-{os.getpid()}/run"
    target = Path(on_node(logical, os.getuid()))  # this user's private root
    secure(target / "step-1")
    reply = subprocess.run(
        ["sh", str(SHIM_PATH), "end-run", logical], capture_output=True, text=True, timeout=10
    )
    assert reply.returncode == 0 and '"removed"' in reply.stdout and not target.exists()
    remove_memory_dir(logical)  # already gone: fine
    assert not target.parent.exists(), "the job's emptied directory goes too"
