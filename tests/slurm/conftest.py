"""Fixtures for tests against a real Slurm on this machine (:mod:`infra.slurm`).

Why one cluster per session: starting munged, slurmctld and three slurmd takes a
few seconds on a loaded machine, and the tests that share it leave it as they found
it (steps ended, nodes undrained). A test that kills a daemon starts its own
cluster (:func:`own_slurm`) so its damage never reaches the next test.

Why skip-or-fail: without root or without the slurm-wlm and munge packages these
tests cannot run and say why (skip); under CI (env ``CI`` set) the same condition
is a hard failure, like the ssh tests in tests/netns.

Every daemon a fixture started is stopped by pid at teardown, and the teardown
asserts that nothing of the cluster (daemons, slurmstepd) is left alive.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from activities.nodes.slurm.rounds import ROUNDS
from infra.slurm import TestSlurm, unavailable_reason


def require_slurm() -> None:
    """Skip the calling test (or fail it, when env CI is set) if Slurm cannot run."""
    reason = unavailable_reason()
    if reason is None:
        return
    message = f"real Slurm unavailable: {reason}"
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI is set: refusing to skip)", pytrace=False)
    pytest.skip(message)


def _stop_and_check(cluster: TestSlurm) -> None:
    try:
        cluster.stop()
        left = cluster.leftovers()
        assert not left, f"processes of the test Slurm still alive after stop: {left}"
    finally:
        cluster.remove()


@pytest.fixture(scope="session", autouse=True)
def venv_on_path() -> Iterator[None]:
    """As from an activated venv: the tasks' ``python3`` (``slurm.python``'s default,
    found on the PATH ``srun`` exports from the worker) is the test venv's, which has
    ``lazarus-rank``. Without it they would find this machine's own ``python3``."""
    previous = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), previous])
    try:
        yield
    finally:
        os.environ["PATH"] = previous


@pytest.fixture(scope="session")
def slurm() -> Iterator[TestSlurm]:
    """The session's cluster: nodes n1..n3 idle, ``SLURM_CONF`` set for this process
    (the agents under test reach Slurm as a worker would)."""
    require_slurm()
    cluster = TestSlurm()
    previous = os.environ.get("SLURM_CONF")
    try:
        cluster.start()
        os.environ["SLURM_CONF"] = str(cluster.conf)
        yield cluster
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        _stop_and_check(cluster)


@pytest.fixture(scope="session")
def allocation(slurm: TestSlurm) -> int:
    """A holder allocation of n1..n3 (``sbatch --no-kill --no-requeue``), as a user
    makes one before starting Lazarus; cancelled when the cluster stops."""
    return slurm.allocate(3)


@pytest.fixture
def own_slurm() -> Iterator[Callable[..., TestSlurm]]:
    """Factory for a private cluster, for tests that kill its daemons (keyword
    arguments: :class:`TestSlurm`'s settings, e.g. ``slurmd_timeout_s``). While it
    runs, ``SLURM_CONF`` points at it; the session cluster's is restored afterwards.
    Each switch drops the shared Slurm answers (:data:`ROUNDS`): they were another
    cluster's, and its job ids and nodes' names are this one's too."""
    require_slurm()
    made: list[TestSlurm] = []
    previous = os.environ.get("SLURM_CONF")

    def factory(**settings: Any) -> TestSlurm:
        cluster = TestSlurm(**settings)
        made.append(cluster)
        cluster.start()
        os.environ["SLURM_CONF"] = str(cluster.conf)
        ROUNDS.forget()
        return cluster

    try:
        yield factory
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        ROUNDS.forget()
        for cluster in reversed(made):
            _stop_and_check(cluster)
