"""The docs build as a site with MkDocs in strict mode (``mkdocs.yml``): a broken
link, a missing anchor or a link into the repository that names no file fails here.

``tests/unit/test_docs.py`` checks the same pages in the fast tier by reading them;
this runs the real docs tool, as the site is published.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_the_docs_build_strictly(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="mkdocs is in the dev extra: make setup")
    site = tmp_path / "site"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (site / "index.html").is_file()
    assert (site / "guides" / "rejoin.html").is_file()
