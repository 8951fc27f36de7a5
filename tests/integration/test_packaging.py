"""An installed Lazarus holds the floors' packages and nothing else, and it runs
from outside the repository.

Two wheels from one tree: ``lazarus-rank`` (``rank/``: ``lazarus.rank`` and the domain
modules it imports) and ``lazarus-train``, the controller, which depends on it and
holds the rest of ``lazarus`` (domain, app) and the design card's top-level packages
``workflows``, ``activities``, ``workers`` and ``infra``. Every file of the tree is in
exactly one of them, under the one path it has in the tree; ``lazarus`` and
``lazarus.domain`` are namespace packages, so neither owns an ``__init__.py`` there.
This builds both wheels from a copy of the tree, offline (``--no-build-isolation``:
the setuptools in this venv), checks what they hold, installs them into a folder and
runs the CLI from there.
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
PACKAGE_FOLDERS = ("workflows", "activities", "workers", "infra")
"""Top-level in the repository and top-level once installed."""
COPIED = ("pyproject.toml", "setup.py", "README.md", "rank", "lazarus", *PACKAGE_FOLDERS)
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


def test_every_file_is_in_exactly_one_wheel(wheels: tuple[Path, Path]) -> None:
    controller, rank = (_files(w) for w in wheels)
    assert controller & rank == set(), f"in both wheels: {sorted(controller & rank)}"
    missing = _repo_modules() - controller - rank
    assert not missing, f"modules in the tree but in neither wheel: {sorted(missing)}"
    assert {n.split("/")[1] for n in rank} == {"rank", "domain"}, sorted(rank)
    assert "lazarus/__init__.py" not in controller | rank, "lazarus is a namespace package"
    with zipfile.ZipFile(wheels[0]) as archive:
        metadata = next(
            archive.read(n).decode()
            for n in archive.namelist()
            if n.endswith(".dist-info/METADATA")
        )
    assert "Requires-Dist: lazarus-rank==" in metadata


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
    for needed in (
        "workflows/job.py",
        "activities/nodes/shim.sh",
        "workers/controller.py",
        "infra/testhosts.py",
        "lazarus/domain/ports.py",
        "lazarus/domain/version.py",
    ):
        assert needed in names, f"{needed} is missing from {wheel.name}"
    assert not any(n.startswith("lazarus/rank/") for n in names), "lazarus.rank is lazarus-rank's"
    assert "lazarus = lazarus.app.cli:run" in entry_points


def test_the_installed_wheel_runs_from_outside_the_repository(
    wheels: tuple[Path, Path], tmp_path: Path
) -> None:
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
            *map(str, wheels),
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
        "import activities.nodes.shim_agent as s, workflows.job as j;"
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
