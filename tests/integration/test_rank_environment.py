"""``lazarus-rank`` on its own, and ranks that import nothing of the controller's
(issue 29, items 1 and 2).

- The rank helper's wheel (``rank/pyproject.toml``), built offline from a copy of the
  tree, installs into a fresh venv with nothing else: ``import lazarus.rank`` works
  there and its metadata lists no dependency.
- A job whose ``command`` runs a separate venv's python (created here, without pip,
  the rank helper installed from that wheel) runs a probe (no torch) that dumps its
  ``sys.path`` and tries ``import temporalio, pydantic``: neither imports, and no
  site-packages of the controller is on its path. Once as a checkout runs it (the
  launcher adds the checkout: Lazarus's own code only), once as an installed
  controller does (the launcher adds nothing: the job's venv brings the helper).

The venvs are made with ``--without-pip`` and filled by this interpreter's pip
(``pip --python``): no download, no ensurepip, a few seconds each.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import site
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

import activities.launcher as launcher
from activities.launcher import launch_generation
from activities.stop import stop_generations
from lazarus.domain.contracts import LaunchRequest, StopRequest
from lazarus.domain.spec import parse_spec
from tests.commands import run_ok

REPO = Path(__file__).resolve().parents[2]
STEP_TIMEOUT_S = 120
WAIT_S = 60.0
"""For the probe's dump: one python start-up on a busy machine."""
CONTROLLER_ONLY = ("temporalio", "pydantic", "boto3", "paramiko", "yaml")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PROBE = (
    f"NAMES = {CONTROLLER_ONLY!r}\n"
    + """\
import json, os, sys
found = {}
for name in NAMES:
    try:
        module = __import__(name)
    except ImportError:
        found[name] = None
    else:
        found[name] = getattr(module, "__file__", None) or "namespace"
import lazarus.rank
out = {
    "executable": sys.executable,
    "path": sys.path,
    "pythonpath": os.environ.get("PYTHONPATH"),
    "found": found,
    "rank_helper": lazarus.rank.__file__,
    "info_rank": lazarus.rank.info().rank,
}
with open(os.environ["PROBE_OUT"], "w") as f:
    json.dump(out, f)
"""
)


_run = functools.partial(run_ok, timeout_s=STEP_TIMEOUT_S)


def _clean_env() -> dict[str, str]:
    """Nothing of this test's PYTHONPATH (the checkout) or Lazarus settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LAZARUS_"))}


@pytest.fixture(scope="module")
def rank_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rank helper's wheel, built offline from a copy of ``rank/`` and ``lazarus/``
    (so the build's ``build/`` and ``*.egg-info`` never land in the tree)."""
    pytest.importorskip("setuptools", reason="building offline needs setuptools in this venv")
    work = tmp_path_factory.mktemp("rank-wheel")
    source = work / "src"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("rank", "lazarus"):
        shutil.copytree(REPO / name, source / name, ignore=ignore)
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
            str(source / "rank"),
        ],
        cwd=work,
    )
    (built,) = out.glob("lazarus_rank-*.whl")
    return built


def _venv_with(wheel: Path, where: Path) -> Path:
    """A fresh venv (no pip) with only the rank helper installed; its python."""
    _run([sys.executable, "-m", "venv", "--without-pip", str(where)], cwd=where.parent)
    python = where / "bin" / "python"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "--disable-pip-version-check",
            str(wheel),
        ],
        cwd=where.parent,
        env=_clean_env(),
    )
    return python


@pytest.fixture(scope="module")
def rank_venv(rank_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One fresh venv with only the rank helper, for every test here (read only)."""
    return _venv_with(rank_wheel, tmp_path_factory.mktemp("rank-venv") / "venv")


def test_the_rank_wheel_installs_alone_and_pulls_no_dependency(
    rank_wheel: Path, rank_venv: Path, tmp_path: Path
) -> None:
    with zipfile.ZipFile(rank_wheel) as archive:
        names = set(archive.namelist())
        metadata = next(
            archive.read(n).decode() for n in names if n.endswith(".dist-info/METADATA")
        )
    assert not [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")], (
        metadata
    )
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"lazarus"}
    assert "lazarus/rank/__init__.py" in names
    # Namespace packages: neither distribution may own lazarus/__init__.py.
    assert "lazarus/__init__.py" not in names and "lazarus/domain/__init__.py" not in names

    python = rank_venv
    venv = python.parent.parent
    probe = (
        "import importlib.metadata as m, json, sys, lazarus.rank;"
        "tops = sorted({n.split('.')[0] for n in sys.modules if not n.startswith('_')}"
        " - set(sys.stdlib_module_names));"
        "print(json.dumps({'file': lazarus.rank.__file__, 'tops': tops,"
        " 'requires': m.requires('lazarus-rank'), 'version': m.version('lazarus-rank'),"
        " 'installed': sorted(d.metadata['Name'] for d in m.distributions())}))"
    )
    # -I: isolated (no PYTHONPATH, no user site, not the current directory).
    got = json.loads(_run([str(python), "-I", "-c", probe], cwd=tmp_path, env=_clean_env()))
    assert Path(got["file"]).resolve().is_relative_to(venv.resolve()), got
    assert got["tops"] == ["lazarus"], f"lazarus.rank imported more than itself: {got['tops']}"
    assert not got["requires"], got
    assert got["installed"] == ["lazarus-rank"], got
    from lazarus.domain.version import __version__

    assert got["version"] == __version__


def _controller_sites() -> list[Path]:
    """Every site-packages of the controller's (this test's) interpreter."""
    return [Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]]


@pytest.mark.parametrize("controller", ["checkout", "installed"])
def test_ranks_run_with_the_jobs_interpreter_and_environment_only(
    controller: str, rank_venv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = rank_venv
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    out = tmp_path / "probe.json"
    if controller == "installed":
        # What lazarus_code_root() answers for a controller in a site-packages.
        monkeypatch.setattr(launcher, "RANK_IMPORT_ROOT", None)
    else:
        assert launcher.RANK_IMPORT_ROOT == REPO, "the tests run from a checkout"
    # A worker run as the tests run it: its PYTHONPATH (the checkout) reaches local
    # ranks unless the spec sets its own; here none, as a user would.
    monkeypatch.delenv("PYTHONPATH", raising=False)
    spec = parse_spec(
        {
            "name": "rank-env",
            "command": [str(python), str(script)],
            "checkpoint_dir": "ckpt",
            "env": {"PROBE_OUT": str(out)},
        },
        "<test>",
    ).resolved(tmp_path)
    try:
        launch_generation(LaunchRequest(spec=spec, generation=1))
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and not out.exists():
            time.sleep(0.1)
        log = next(Path(spec.run_dir).rglob("rank-0.log"), None)
        said = log.read_text(errors="replace")[-2000:] if log else "no log"
        assert out.exists(), f"no probe dump within {WAIT_S}s; rank 0 said:\n{said}"
        got: dict[str, Any] = json.loads(out.read_text())
    finally:
        run_root = str(Path(spec.run_dir) / spec.job_id)
        asyncio.run(stop_generations(StopRequest(job_id=spec.job_id, run_root=run_root)))

    assert Path(got["executable"]).parent == python.parent, got["executable"]
    importable = {name: where for name, where in got["found"].items() if where is not None}
    assert importable == {}, f"the rank imported the controller's packages: {importable}"
    sites = _controller_sites()
    on_path = [
        entry
        for entry in got["path"]
        if entry and any(Path(entry).resolve().is_relative_to(s) for s in sites)
    ]
    assert on_path == [], f"the controller's site-packages on the rank's sys.path: {on_path}"
    assert got["info_rank"] == 0
    helper = Path(got["rank_helper"]).resolve()
    if controller == "installed":
        assert got["pythonpath"] is None, got["pythonpath"]
        assert helper.is_relative_to(python.parent.parent.resolve()), helper
    else:
        assert got["pythonpath"] == str(REPO), got["pythonpath"]
        assert helper.is_relative_to(REPO), helper
