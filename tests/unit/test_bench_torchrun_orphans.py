"""The torchrun harness kills what an agent started even after the agent died alone.

NVRx's ``ft_launcher`` starts rank monitors in sessions of their own. The soak's
controller crash SIGKILLs the agent alone; the operator's restart then killed the
ranks but left the monitors running (two per crash), because only the agent's process
group and the ranks were killed. The harness now remembers every descendant of an agent
with its start time and kills each one still alive.

The agent here is a shell that starts a child in a new session, standing in for
``ft_launcher`` and its monitor."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from activities.nodes.procfs import is_alive, read_stat
from bench.torchrun import TorchrunJob

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


def test_a_monitor_in_its_own_session_dies_with_the_job_after_the_agent_was_killed(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "monitor.pid"
    agent = subprocess.Popen(
        ["bash", "-c", f"setsid sleep 300 & echo $! > {pid_file}; wait"],
        start_new_session=True,
    )
    job = TorchrunJob(example_args=[], log_path=tmp_path / "job.log")
    job.agents.append(agent)
    monitor = 0
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline, "the stand-in agent never started its monitor"
            time.sleep(0.05)
        monitor = int(pid_file.read_text())
        stat = read_stat(monitor)
        assert stat is not None
        job._poll_once()  # the harness's poll, as its thread runs it every 50 ms
        job.kill_agent()  # the soak's controller crash: the agent alone
        assert is_alive(monitor, stat.start_ticks), "orphaned, not killed with the agent"
        job.kill_processes()  # the soak's operator
        assert not is_alive(monitor, stat.start_ticks)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        if monitor:
            subprocess.run(["kill", "-9", str(monitor)], check=False, capture_output=True)
