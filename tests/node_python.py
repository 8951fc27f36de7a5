"""A node's own Python at another path, with ``lazarus-rank`` and nothing else of
Lazarus: what a compute node or an ssh host needs (issue 39).

Built once per session: ``lazarus-rank``'s wheel from a copy of the tree
(``python -m build --no-isolation --wheel rank``, as ``make dist``), a venv without
pip from the base interpreter (no system site-packages), and the wheel unpacked into
its site-packages by the test venv's pip (``--target``, no index). The venv imports
``lazarus.rank`` and cannot import ``activities``, ``workflows`` or pydantic.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from activities.start_checks import check_start
from lazarus.app.client import StartPlan, plan_start
from lazarus.domain.spec import JobSpec
from lazarus.domain.worker_calls import StartCheckRequest

REPO = Path(__file__).resolve().parents[1]
PIP_INSTALL = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]

RANK_SCRIPT = """\
import importlib.util, json, os, sys
from pathlib import Path

import lazarus.rank as lazarus_rank

me = lazarus_rank.info()
for step in range(1, 4):
    lazarus_rank.heartbeat(step)
missing = [m for m in ("activities", "workflows", "pydantic") if importlib.util.find_spec(m)]
parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\\0")
out = Path(sys.argv[1]) / f"rank{me.rank}.json"
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps({
    "rank": me.rank,
    "executable": sys.executable,
    "helper": lazarus_rank.__file__,
    "controller_modules": missing,
    "parent": [p.decode() for p in parent if p],
    "path": os.environ.get("PATH"),
    "pythonpath": os.environ.get("PYTHONPATH"),
    "node_env": os.environ.get("NODE_SETTING"),
    "env": {k: v for k, v in os.environ.items() if k in (
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "LAZARUS_NODE", "LAZARUS_RUN_DIR")},
}))
"""
"""A standard-library rank: heartbeats through ``lazarus.rank``, then one JSON file
saying which interpreter ran it, where the helper came from, which controller modules
are importable, its keeper's command line, PATH, PYTHONPATH and launch variables."""


def rank_only_python(work: Path) -> Path:
    """``work/opt/nodepy/bin/python``: the node's interpreter with lazarus-rank only."""
    python = work / "opt" / "nodepy" / "bin" / "python"
    if python.exists():
        return python
    source = work / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist")
    for name in ("rank", "lazarus"):
        shutil.copytree(REPO / name, source / name, ignore=ignore)
    dist = work / "dist"
    build = [sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", str(dist)]
    subprocess.run([*build, "rank"], cwd=source, check=True, capture_output=True, timeout=300)
    (wheel,) = dist.glob("lazarus_rank-*.whl")
    venv = python.parent.parent
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (site,) = venv.glob("lib/python*/site-packages")
    subprocess.run(
        [*PIP_INSTALL, "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    check = subprocess.run(
        [
            str(python),
            "-c",
            "import lazarus.rank, importlib.util as u; "
            "print(u.find_spec('activities') is None and u.find_spec('pydantic') is None)",
        ],
        cwd=work,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.stdout.strip() == "True", check.stdout + check.stderr
    return python


def worker_plan(spec: JobSpec) -> StartPlan:
    """What ``start --dry-run`` shows for ``spec``: the worker's plan
    (``activities/start_checks.py``), made here as the worker makes it."""
    checked = check_start(StartCheckRequest(spec=spec, spec_file="<test>", dry_run=True))
    assert not checked.problems, checked.problems
    return plan_start(spec, checked=checked)


def assert_launch_matches_dry_run(
    plan: StartPlan, seen: dict[int, dict[str, Any]], gen: Path, names: dict[str, str] | None = None
) -> None:
    """The launched generation is what ``start --dry-run`` showed (issue 39): the nodes
    and their ranks (``plan.json``), ``MASTER_ADDR`` (``launch.json``, unless the dry
    run says only the launch can know it) and each rank's variables, placeholders
    aside. ``names`` maps a dry run's placeholder node names to Slurm's."""
    names = names or {}
    launched = json.loads((gen / "plan.json").read_text())
    assert [names.get(n.name, n.name) for n in plan.nodes] == launched["nodes"], launched
    assert len(plan.ranks) == len(seen) == sum(len(n.ranks) for n in plan.nodes)
    for node in plan.nodes:
        for rank in node.ranks:
            assert seen[rank]["env"]["LAZARUS_NODE"] == names.get(node.name, node.name)
    master = plan.nodes[0].address
    if not master.startswith("<"):
        assert json.loads((gen / "launch.json").read_text())["master_addr"] == master
    for rank, rank_seen in seen.items():
        shown = plan.ranks[rank]
        for name, value in rank_seen["env"].items():
            want = shown[name]
            for placeholder, real in names.items():
                want = want.replace(placeholder, real)
            if "<" in want:  # known only at launch: the text before it must match
                assert value.startswith(want.split("<")[0]), (name, want, value)
            else:
                assert value == want, (rank, name, want, value)
        if rank_seen["pythonpath"] is None:
            assert "PYTHONPATH" not in shown, shown
