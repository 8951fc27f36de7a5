"""The test Slurm's nodes are apart in memory: each slurmd (and every step it runs)
has its own tmpfs on /dev/shm, which goes when the last of the node's processes does."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from infra.slurm import TestSlurm
from lazarus.domain.memory_tier import private_root
from tests.namespaces import in_mount_namespace, mounted_anywhere


@pytest.mark.timeout(240)
def test_each_node_has_its_own_dev_shm_and_loses_it_when_killed(
    own_slurm: Callable[[], TestSlurm],
) -> None:
    cluster = own_slurm()
    folder = f"{private_root(os.getuid())}/lzt-test-{secrets.token_hex(4)}"

    def on(node: str, script: str) -> str:
        done = cluster.command("srun", "-N", "1", "-w", node, "sh", "-c", script)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert on("n1", f"mkdir -p {folder} && echo snapshot > {folder}/step && echo ok") == "ok"
    assert on("n1", f"cat {folder}/step") == "snapshot"
    assert on("n2", f"test -e {folder} || echo absent") == "absent"
    assert not Path(folder).exists()
    namespace = cluster.mount_namespace("n1")
    assert namespace is not None
    assert namespace not in {cluster.mount_namespace("n2"), os.readlink("/proc/self/ns/mnt")}
    assert mounted_anywhere(cluster.shm_source("n1"))

    cluster.kill_slurmd("n1")  # no step runs there: nothing else holds the node

    deadline = time.monotonic() + 10
    while in_mount_namespace(namespace) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert in_mount_namespace(namespace) == []
    assert mounted_anywhere(cluster.shm_source("n1")) == []
    assert mounted_anywhere(cluster.shm_source("n2"))
