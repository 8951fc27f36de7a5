"""Warm starts on Slurm nodes: the run's zygote as a job step of its own per node.

The half of :class:`~activities.nodes.slurm.agent.SlurmAgent` that deals with ranks
forked from a zygote: starting the zygote's step, forking through the node-local
shim, stopping forked ranks by process group on the node (their cgroup is the
zygote's step, which a step cancel would kill too), and cancelling the zygote's step
at the run's end. See docs/guides/warm-starts.md, "Warm starts on Slurm nodes".
"""

from __future__ import annotations

import hashlib
import shlex
import subprocess
import sys
import time
from abc import abstractmethod
from pathlib import Path
from typing import Any

from activities.nodes.agent import NodeAgent, NodeRefused, NodeUnreachable
from activities.nodes.node_records import (
    CarryRequest,
    CarryResult,
    NodeStopResult,
    RankLaunch,
    StartedRank,
    WarmStart,
)
from activities.nodes.rundir import GenerationDir, SrunFiles, read_json, runs, write_json_atomic
from activities.nodes.shim_agent import carry_through_shim, refused_all
from activities.nodes.slurm.commands import SlurmCommandFailed, job_steps, slurm_command
from activities.nodes.slurm.drain import SlurmDrain
from activities.nodes.slurm.shim import SrunShim, send, step_lock_at
from activities.nodes.warm_starts import FORKED_MARK, zygote_environment
from activities.nodes.zygote import PID_FILE as ZYGOTE_PID_FILE
from activities.nodes.zygote_socket import SOCKET_FILE as ZYGOTE_SOCKET_FILE
from activities.nodes.zygote_socket import zygote_dir

ZYGOTE_STEP = "slurm-step.json"
"""In a zygote directory: the record of the zygote's step (job, name, node)."""
ZYGOTE_GONE_WAIT_S = 30.0
"""How long the run's end waits for a cancelled zygote step to leave ``squeue``."""
LAZARUS_ROOT = str(Path(__file__).resolve().parents[2])
"""Where ``activities`` is imported from: the same path on every node (see the guide)."""


def merged_stop(steps: NodeStopResult, forked: NodeStopResult) -> NodeStopResult:
    """One node's stop: its steps' and its forked ranks'."""
    last = [s for s in (steps.last_step, forked.last_step) if s is not None]
    reachable = steps.reachable and forked.reachable
    return NodeStopResult(
        node=steps.node,
        reachable=reachable,
        error=None if reachable else (steps.error or forked.error),
        signalled_groups=steps.signalled_groups + forked.signalled_groups,
        killed_groups=steps.killed_groups + forked.killed_groups,
        last_step=max(last) if last else None,
        generations=sorted({*steps.generations, *forked.generations}),
        unkillable=[*steps.unkillable, *forked.unkillable],
    )


def zygote_step_name(directory: Path, node: str) -> str:
    """Unique per run and node (the zygote directory is the run's)."""
    digest = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:10]
    return f"lazarus-zygote-{digest}-{node}"


class SlurmWarm(SlurmDrain):
    """The warm-start side of the Slurm agent (a mixin: the agent supplies the rest)."""

    @abstractmethod
    def _job(self) -> int: ...

    @abstractmethod
    def _shim(self) -> SrunShim: ...

    @abstractmethod
    def _detach(self, directory: Path, srun: list[str], env: dict[str, str], cwd: str) -> None: ...

    @abstractmethod
    def _wait_gone(self, step_ids: list[str], timeout_s: float) -> list[str]: ...

    @abstractmethod
    def _stop_older_steps(
        self, run_root: str, generation: int, kill_wait_s: float
    ) -> NodeStopResult: ...

    rejoin_unsupported = (
        "its process runs in a generation's Slurm step, which the next generation must "
        "not outlive: only ranks forked from the node's zygote (warm_start) rejoin"
    )

    def carry_survivors(self, request: CarryRequest) -> CarryResult:
        """Ranks forked from the node's zygote live in the zygote's step, not in a
        generation's: they can outlive their generation. When every asked-for rank of
        the previous generation here was forked, the older generations' steps (ranks
        that started cold) are cancelled first, then the carry runs on the node through
        the shim (:mod:`activities.nodes.carry`, as on ssh: survivors checked, every
        other forked group fenced by process group, records linked, rejoin requested).
        Otherwise, or when the shim gives no answer, the default: everything older is
        stopped and the ranks start afresh."""
        previous = GenerationDir(Path(request.previous_gen_dir))
        records = [read_json(previous.pid_file(r)) for r in request.ranks]
        if not request.ranks or any(r is None or "slurm_step" in r for r in records):
            return NodeAgent.carry_survivors(self, request)
        stepped = self._stop_older_steps(request.run_root, request.generation, request.kill_wait_s)
        if not stepped.reachable:
            raise NodeUnreachable(stepped.error or f"node {self.node.name} is unreachable")
        outcome = carry_through_shim(request, self._shim()._call, self.command_timeout_s)
        if isinstance(outcome, CarryResult):
            unkillable = [*stepped.unkillable, *outcome.unkillable]
            return outcome.model_copy(update={"unkillable": unkillable})
        fallback = NodeAgent.carry_survivors(self, request)
        return refused_all(fallback, request, self.node.name, outcome)

    def start_ranks_warm(
        self, gen_dir: str, ranks: list[RankLaunch], warm: WarmStart
    ) -> list[StartedRank]:
        """Fork the node's ranks from the run's zygote there, which runs as its own job
        step (``srun --overlap -N1 -w <node> python -m activities.nodes.zygote
        --foreground``), so Slurm ends it with the allocation at the latest, and the
        run's end cancels it. The forks go through the node-local shim (the zygote's
        socket is on the node); ranks it cannot fork start cold as a step of their own,
        with the reason.

        A zygote step that has ended (the zygote died, or was cancelled) is started
        again: the run's first launch on the node waits for it to preload, a later
        launch starts cold now and warm from the next launch, as on ssh."""
        if not ranks:
            return []
        directory = zygote_dir(warm.run_root, self.node.name)
        first = not (directory / FORKED_MARK).exists()
        try:
            started = self._ensure_zygote_step(directory, warm, ranks[0])
        except (NodeRefused, SlurmCommandFailed, OSError, subprocess.SubprocessError) as exc:
            return self._cold(gen_dir, ranks, f"the zygote's Slurm step could not start: {exc}")
        if started and not first:
            return self._cold(
                gen_dir,
                ranks,
                "the zygote's Slurm step had ended; started a new one: warm starts resume "
                "from the next launch",
            )
        shim = SrunShim(self.node, self._job(), self.command_timeout_s, cold=self.start_ranks)
        return shim.start_ranks_warm(gen_dir, ranks, warm)

    def prewarm(self, launch: RankLaunch, warm: WarmStart) -> str | None:
        """A spare of the allocation gets its zygote's step now (not waited for), as a
        node's first launch would start it: the launch that swaps the spare in then
        finds it running and forks once it serves. The step ends with the allocation
        at the latest, and the run's end cancels it (:meth:`_end_zygote_steps`)."""
        directory = zygote_dir(warm.run_root, self.node.name)
        try:
            self._ensure_zygote_step(directory, warm, launch)
        except (NodeRefused, SlurmCommandFailed, OSError, subprocess.SubprocessError) as exc:
            return f"the zygote's Slurm step could not start: {exc}"
        return None

    def _cold(self, gen_dir: str, ranks: list[RankLaunch], reason: str) -> list[StartedRank]:
        return [
            r if r.adopted else r.model_copy(update={"cold_reason": reason})
            for r in self.start_ranks(gen_dir, ranks)
        ]

    def _ensure_zygote_step(self, directory: Path, warm: WarmStart, template: RankLaunch) -> bool:
        """Start the zygote's step unless it runs (or its ``srun`` is still creating it);
        True when started now. One per run and node: under the directory's lock, so a
        retried launch adopts the step a lost attempt started."""
        directory.mkdir(parents=True, exist_ok=True)
        with step_lock_at(directory / "slurm-step.lock"):
            record = read_json(directory / ZYGOTE_STEP)
            if record is not None and self._zygote_step_live(directory, record):
                return False
            for stale in (ZYGOTE_PID_FILE, ZYGOTE_SOCKET_FILE, *SrunFiles.of(self.node.name)):
                (directory / stale).unlink(missing_ok=True)
            name = zygote_step_name(directory, self.node.name)
            env = zygote_environment(template.env)
            zygote = [
                sys.executable,
                "-m",
                "activities.nodes.zygote",
                "--run-dir",
                str(directory),
                "--preload",
                ",".join(warm.preload),
                "--standby",
                str(warm.standby),
                "--foreground",
                "--verbs",
            ]
            srun = [
                slurm_command("srun"),
                f"--jobid={self._job()}",
                "--overlap",
                "-N1",
                "-n1",
                "-w",
                self.node.name,
                "--kill-on-bad-exit=0",
                "--cpu-bind=none",
                f"--job-name={name}",
                "--export=ALL",
                f"--chdir={template.workdir}",
                *zygote,
            ]
            write_json_atomic(
                directory / ZYGOTE_STEP,
                {"job_id": self._job(), "name": name, "node": self.node.name, "at": time.time()},
            )
            self._detach(directory, srun, env, template.workdir)
            return True

    def _zygote_step_live(self, directory: Path, record: dict[str, Any]) -> bool:
        """Listed by Slurm, or its ``srun`` has not ended yet (still creating it), or
        Slurm cannot be asked (never start a second zygote on a guess)."""
        steps = job_steps(str(record.get("job_id")))
        if steps is None:
            return True
        if any(name == record.get("name") for name, _ in steps.values()):
            return True
        files = SrunFiles.of(self.node.name)
        return (directory / files.pid).exists() and not (directory / files.exit).exists()

    def _zygote_steps(self, run_root: Path) -> list[str]:
        """The listed steps of this node's zygotes of ``run_root`` and the runs below it."""
        found: list[str] = []
        for root in [run_root, *runs(run_root)]:
            record = read_json(zygote_dir(root, self.node.name) / ZYGOTE_STEP)
            if record is None:
                continue
            steps = job_steps(str(record.get("job_id"))) or {}
            found += [s for s, (name, _) in steps.items() if name == record.get("name")]
        return found

    def _forked_here(self, gen: GenerationDir) -> bool:
        """Whether some rank of this node in ``gen`` was forked from its zygote (a pid
        record without a step: the standby wrote it)."""
        plan = read_json(gen.plan_file) or {}
        nodes = [str(n) for n in plan.get("nodes") or []]
        nproc = int(plan.get("nproc_per_node", 1))
        if self.node.name not in nodes:
            return False
        first = nodes.index(self.node.name) * nproc
        return any(
            (record := read_json(gen.pid_file(rank))) is not None and "slurm_step" not in record
            for rank in range(first, first + nproc)
        )

    def _stop_forked(
        self, run_root: str, keep_generation: int | None, grace_s: float, kill_wait_s: float
    ) -> NodeStopResult:
        """Stop this node's forked ranks on the node (``slurm_task local-stop`` through
        ``srun -w``): by process group, start ticks checked, as a local node's ranks.
        Not by step: their step is the zygote's, which must live on."""
        argv = [
            sys.executable,
            "-m",
            "activities.nodes.slurm_task",
            "local-stop",
            "--run-root",
            run_root,
            "--node",
            self.node.name,
            *(["--keep", str(keep_generation)] if keep_generation is not None else []),
            "--grace",
            f"{grace_s:g}",
            "--kill-wait",
            f"{kill_wait_s:g}",
        ]
        script = f"PYTHONPATH={shlex.quote(LAZARUS_ROOT)}${{PYTHONPATH:+:$PYTHONPATH}}\n"
        script += "export PYTHONPATH\nexec "
        script += " ".join(shlex.quote(a) for a in argv) + "\n"
        timeout = self.command_timeout_s + grace_s + kill_wait_s
        try:
            reply = self._shim()._run(script.encode(), timeout)
        except NodeUnreachable as exc:
            return NodeStopResult(node=self.node.name, reachable=False, error=str(exc))
        text = reply.output.decode(errors="replace")
        line = next((ln for ln in reversed(text.splitlines()) if ln.startswith("{")), None)
        if reply.exit_code != 0 or line is None:
            return NodeStopResult(
                node=self.node.name,
                reachable=False,
                error=f"node {self.node.name}: stopping its forked ranks failed: "
                f"{' '.join(text.split())[-300:] or f'exit {reply.exit_code}'}",
            )
        return NodeStopResult.model_validate_json(line)

    def _end_zygote_steps(self, run_root: Path) -> None:
        """Cancel this node's zygote steps of ``run_root`` and wait until Slurm no
        longer lists them (at most :data:`ZYGOTE_GONE_WAIT_S`)."""
        steps = self._zygote_steps(run_root)
        for step in steps:
            send(["scancel", step])
        left = self._wait_gone(steps, ZYGOTE_GONE_WAIT_S)
        if left:
            raise NodeRefused(
                f"node {self.node.name}: zygote step(s) {', '.join(left)} still listed "
                f"{ZYGOTE_GONE_WAIT_S:g} s after scancel"
            )
