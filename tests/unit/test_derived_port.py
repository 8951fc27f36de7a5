"""Derived rendezvous ports (SSH and Slurm nodes) stay out of the ephemeral range.

CI lost a Slurm relaunch to EADDRINUSE on port 32840: the derived range (20000 to
49999) overlapped Linux's ephemeral ports, where any outgoing connection on the
master node may hold the port already.
"""

from __future__ import annotations

from activities.launcher import DERIVED_PORTS, derived_port

EPHEMERAL_LOW = 32768  # Linux's default ip_local_port_range starts here


def test_derived_ports_stay_below_the_ephemeral_range() -> None:
    ports = {derived_port(f"job-{j}", g) for j in range(200) for g in range(1, 50)}
    assert min(ports) >= DERIVED_PORTS.start and max(ports) < EPHEMERAL_LOW
    assert len(ports) > 5000  # spread: neighbouring generations rarely share a port


def test_a_retried_launch_derives_the_same_port() -> None:
    assert derived_port("ddp-demo", 7) == derived_port("ddp-demo", 7)
    assert derived_port("ddp-demo", 7) != derived_port("ddp-demo", 8)
