"""A SIGKILL is ``oom_host`` only with evidence (issue 10, defect 15).

Fake /proc, cgroup and kernel-log files stand in for the kernel, so these run
without privileges and without running anything out of memory.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from activities.diagnosis import (
    KERNEL_NOT_VISIBLE,
    NO_KERNEL_RECORD,
    diagnose_crash,
    diagnose_vanished,
)
from activities.kernel_evidence import KernelSources, OomWatch, kernel_log_line
from activities.nodes.agent import NodeStatus, RankRecord
from activities.supervise import attach_evidence
from activities.supervise_observer import GenerationObserver
from activities.supervise_rules import evaluate
from lazarus.domain.contracts import SuperviseRequest
from lazarus.domain.spec import HealthSpec, NodeSpec
from tests.fake_nodes import FakeAgent, FakeClock

PID = 4242
CLK_TCK = 100
STARTED_S = 500.0  # the rank's start, seconds since boot


class FakeKernel:
    """A /proc entry, a cgroup v2 directory and a /dev/kmsg for one rank."""

    def __init__(self, root: Path) -> None:
        self.proc = root / "proc"
        self.cgroups = root / "cgroup"
        self.kmsg = root / "kmsg"
        self.cgroup = self.cgroups / "user.slice" / "job.scope"
        (self.proc / str(PID)).mkdir(parents=True)
        (self.proc / str(PID) / "cgroup").write_text("0::/user.slice/job.scope\n")
        fields = ["S"] + ["0"] * 18 + [str(int(STARTED_S * CLK_TCK))] + ["0"] * 10
        (self.proc / str(PID) / "stat").write_text(f"{PID} (python) {' '.join(fields)}\n")
        self.cgroup.mkdir(parents=True)
        self.set_oom_kills(0)
        self.kmsg.write_text("6,1,1000000,-;Linux version 6.1\n")

    def set_oom_kills(self, count: int) -> None:
        (self.cgroup / "memory.events").write_text(
            f"low 0\nhigh 0\nmax 3\noom {count}\noom_kill {count}\noom_group_kill 0\n"
        )

    def log(self, at_s: float, message: str) -> None:
        with self.kmsg.open("a") as handle:
            handle.write(f"3,2,{int(at_s * 1e6)},-;{message}\n")
            handle.write(" SUBSYSTEM=memory\n")  # a continuation line, as kmsg has

    def sources(self, **overrides: object) -> KernelSources:
        base: dict[str, object] = {
            "proc_root": self.proc,
            "cgroup_root": self.cgroups,
            "kmsg_path": self.kmsg,
            "dmesg_command": None,
            "clock_ticks": CLK_TCK,
        }
        return KernelSources(**{**base, **overrides})  # type: ignore[arg-type]


@pytest.fixture
def kernel(tmp_path: Path) -> FakeKernel:
    return FakeKernel(tmp_path)


def test_a_rise_of_the_cgroup_oom_kill_counter_is_evidence(kernel: FakeKernel) -> None:
    watch = OomWatch(kernel.sources())
    kernel.set_oom_kills(2)  # earlier kills, before the rank was first seen
    watch.watch(0, PID)
    assert watch.evidence(0, PID) == []
    kernel.set_oom_kills(3)
    [line] = watch.evidence(0, PID)
    assert "memory.events: oom_kill rose from 2 to 3" in line and f"pid {PID}" in line


def test_a_cgroup_v1_memory_hierarchy_is_read_too(kernel: FakeKernel) -> None:
    """Hybrid hosts: cgroup v2 holds no memory controller, v1 counts OOM kills in
    memory.oom_control."""
    (kernel.proc / str(PID) / "cgroup").write_text("4:memory:/job/a\n1:cpu:/\n0::/\n")
    v1 = kernel.cgroups / "memory" / "job" / "a"
    v1.mkdir(parents=True)
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    watch = OomWatch(kernel.sources())
    watch.watch(0, PID)
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    [line] = watch.evidence(0, PID)
    assert "memory.oom_control: oom_kill rose from 0 to 1" in line


def test_the_kernel_log_naming_the_pid_is_evidence(kernel: FakeKernel) -> None:
    watch = OomWatch(kernel.sources())
    watch.watch(0, PID)
    kernel.log(STARTED_S + 60, "Out of memory: Killed process 99 (other) total-vm:1kB")
    assert watch.evidence(0, PID) == []
    kernel.log(
        STARTED_S + 61,
        f"oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),task=python,pid={PID},uid=1000",
    )
    kernel.log(STARTED_S + 61, f"Memory cgroup out of memory: Killed process {PID} (python)")
    [line] = watch.evidence(0, PID)
    assert line.startswith("kernel log: ") and f"Killed process {PID}" in line


def test_a_kernel_record_older_than_the_rank_is_about_another_process(
    kernel: FakeKernel,
) -> None:
    kernel.log(STARTED_S - 100, f"Out of memory: Killed process {PID} (python)")
    watch = OomWatch(kernel.sources())
    watch.watch(0, PID)
    assert watch.evidence(0, PID) == []


@pytest.mark.slow  # runs a dmesg stand-in
def test_dmesg_is_the_fallback_when_kmsg_cannot_be_read(kernel: FakeKernel) -> None:
    script = f"print('[{STARTED_S + 5:.6f}] Out of memory: Killed process {PID} (python)')"
    sources = kernel.sources(
        kmsg_path=kernel.proc / "no-such-kmsg", dmesg_command=(sys.executable, "-c", script)
    )
    line = kernel_log_line(PID, sources, since_s=STARTED_S)
    assert line is not None and f"Killed process {PID}" in line


@pytest.mark.slow  # runs a dmesg stand-in
def test_nothing_readable_means_no_evidence(kernel: FakeKernel) -> None:
    sources = kernel.sources(
        kmsg_path=kernel.proc / "no-such-kmsg",
        dmesg_command=(sys.executable, "-c", "import sys; sys.exit(1)"),
        cgroup_root=kernel.proc / "no-cgroups",
    )
    watch = OomWatch(sources)
    watch.watch(0, PID)
    assert watch.evidence(0, PID) == []


# ---------------------------------------------------------------- diagnosis


def test_a_bare_sigkill_without_kernel_evidence_is_killed_not_oom() -> None:
    diagnosis = diagnose_crash("step 10 loss 2.3\n", -9, "SIGKILL", kernel_evidence=[])
    assert diagnosis.failure_class == "killed"
    assert NO_KERNEL_RECORD in diagnosis.evidence


def test_a_bare_sigkill_on_a_node_we_cannot_see_into_is_killed() -> None:
    diagnosis = diagnose_crash("step 10 loss 2.3\n", -9, "SIGKILL", kernel_evidence=None)
    assert diagnosis.failure_class == "killed" and KERNEL_NOT_VISIBLE in diagnosis.evidence


def test_a_sigkill_with_the_kernels_record_is_oom_host_and_says_which() -> None:
    record = f"kernel log: Out of memory: Killed process {PID} (python)"
    diagnosis = diagnose_crash("step 10\n", -9, "SIGKILL", kernel_evidence=[record])
    assert diagnosis.failure_class == "oom_host" and record in diagnosis.evidence


def test_an_oom_message_in_the_log_is_evidence_enough() -> None:
    log = "RuntimeError: DefaultCPUAllocator: not enough memory: you tried to allocate 8 bytes\n"
    diagnosis = diagnose_crash(log, -9, "SIGKILL", kernel_evidence=[])
    assert diagnosis.failure_class == "oom_host"


def test_other_classes_are_untouched_by_the_sigkill_rule() -> None:
    log = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    assert diagnose_crash(log, -9, "SIGKILL", kernel_evidence=[]).failure_class == "oom_gpu"
    assert diagnose_crash("x\n", -15, "SIGTERM", kernel_evidence=[]).failure_class == "preempted"


def test_a_vanished_rank_is_killed_unless_the_kernel_says_oom() -> None:
    assert diagnose_vanished([]).failure_class == "killed"
    assert diagnose_vanished(["kernel log: Killed process 1"]).failure_class == "oom_host"


# ---------------------------------------------------------------- the supervisor


def _request(tmp_path: Path) -> SuperviseRequest:
    return SuperviseRequest(
        job_id="j",
        generation=1,
        run_dir=str(tmp_path / "gen-00001"),
        world_size=1,
        health=HealthSpec(hang_timeout_s=10, startup_timeout_s=60),
    )


def _statuses(record: RankRecord) -> NodeStatus:
    return NodeStatus(node="local", reachable=True, ranks=[record], observed_at=0.0)


@pytest.mark.parametrize(("oom_kills_at_exit", "expected"), [(1, "oom_host"), (0, "killed")])
def test_supervisor_records_the_counter_while_alive_and_compares_at_exit(
    kernel: FakeKernel, tmp_path: Path, oom_kills_at_exit: int, expected: str
) -> None:
    agent = FakeAgent(NodeSpec())
    observer = GenerationObserver(
        _request(tmp_path), [agent], clock=FakeClock(), kernel=kernel.sources()
    )
    agent.reply = _statuses(RankRecord(rank=0, pid=PID, alive=True))
    observer.observe()  # first seen alive: the baseline is 0
    kernel.set_oom_kills(oom_kills_at_exit)
    exit_record = {"exit_code": -9, "signal": "SIGKILL", "ended_at": 1.0}
    agent.reply = _statuses(RankRecord(rank=0, pid=PID, alive=False, exit=exit_record))
    outcome = evaluate(_request(tmp_path), observer.observe(), started_at=0.0)
    assert outcome is not None and outcome.failure is not None
    failure = attach_evidence(observer, outcome)
    assert failure.failure_class == expected, failure.evidence
    if expected == "oom_host":
        assert any("memory.events: oom_kill rose from 0 to 1" in e for e in failure.evidence)


def test_kernel_records_of_remote_nodes_are_not_looked_for(
    kernel: FakeKernel, tmp_path: Path
) -> None:
    agent = FakeAgent(NodeSpec(name="n1", host="n1", launcher="ssh"))
    observer = GenerationObserver(
        _request(tmp_path), [agent], clock=FakeClock(), kernel=kernel.sources()
    )
    kernel.log(STARTED_S + 1, f"Out of memory: Killed process {PID} (python)")
    assert observer.kernel_evidence_for(0, PID) is None  # that pid is this machine's
