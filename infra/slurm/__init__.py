"""A real Slurm on this machine for tests: :class:`TestSlurm` (munged, slurmctld and
three slurmd as nodes n1..n3) from ``slurm.conf.template``."""

from infra.slurm.cluster import NODES, TEMPLATE, TestSlurm, unavailable_reason

__all__ = ["NODES", "TEMPLATE", "TestSlurm", "unavailable_reason"]
