"""One checked subprocess step for tests that build wheels and venvs: its output, or a
failure that shows the command and everything it printed."""

from __future__ import annotations

import subprocess
from pathlib import Path


def run_ok(
    command: list[str], cwd: Path, env: dict[str, str] | None = None, *, timeout_s: float
) -> str:
    """Run ``command`` to completion (at most ``timeout_s``) and return its stdout."""
    done = subprocess.run(
        command,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, (
        f"{' '.join(command)} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    )
    return done.stdout
