"""The controller's wheel leaves out what its dependency ``lazarus-rank`` ships.

``lazarus-rank`` (``rank/pyproject.toml``) ships :mod:`lazarus.rank` and the domain
modules listed there under ``py-modules``, from this same tree; ``pyproject.toml``
excludes the package, and this drops those modules from ``lazarus.domain``, so each
file is in exactly one distribution (two that shared a file would break each other
on uninstall). Everything else is configured in ``pyproject.toml``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_py import build_py

RANK_PROJECT = Path(__file__).resolve().parent / "rank" / "pyproject.toml"


def rank_modules() -> set[str]:
    """The dotted names of the modules ``lazarus-rank`` ships outside ``lazarus.rank``."""
    config = tomllib.loads(RANK_PROJECT.read_text())
    return set(config["tool"]["setuptools"]["py-modules"])


class ControllerBuildPy(build_py):  # type: ignore[misc]  # setuptools is untyped
    """``build_py`` without the rank distribution's modules."""

    def find_package_modules(self, package: str, package_dir: str) -> Any:
        theirs = rank_modules()
        found = super().find_package_modules(package, package_dir)
        return [entry for entry in found if f"{entry[0]}.{entry[1]}" not in theirs]


setup(cmdclass={"build_py": ControllerBuildPy})
