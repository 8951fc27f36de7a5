"""Supervising a generation: long-running, heartbeating, and stateless across workers.

Everything the supervisor needs is on disk in the generation's run directory, so
an attempt started after a worker crash re-attaches with no loss: exit-status
files say what ended while nobody watched, and heartbeat files say how far each
rank got. What files cannot hold (when the controller first saw each rank's
current progress, when a node went quiet) travels in the activity heartbeat.

Every clock is the controller's own. A heartbeat's timestamp is written by the
node's clock, which may be seconds off: staleness is measured from the moment
the controller first saw each new heartbeat or log step (monotonic time), never
by subtracting a remote timestamp from the local clock. The one exception is a
node on this machine (:attr:`NodeAgent.shares_clock`), whose timestamp *is* our
clock: its progress is dated at the write, inside the window the polls prove. A
round is also scheduled when the earliest hang clock runs out
(:func:`until_hang_check`), so a hang is judged at ``hang_timeout_s``, not up to
one round later.

The split is deliberate: :class:`GenerationObserver` does the I/O
(:mod:`activities.supervise_observer`) and :func:`evaluate` is a pure
function from one observation to an outcome
(:mod:`activities.supervise_rules`), so the detection rules are unit-tested
without processes. This module is the activity: the poll loop, the wait between
rounds, and the outcome as it goes into history.

Scale (one activity supervises every node of a generation; ``python -m bench
scale`` measures it on simulated nodes):

- A poll round starts every ``poll_interval_s`` from the start of the last one,
  polls every node at once (at most :data:`MAX_POLL_THREADS` in flight, one per
  node) and waits for answers at most one interval. A node whose poll is still
  out is *waiting*: its last answer stands, its ranks are not judged for hangs,
  and its poll counts when its agent gives a verdict. So a silent node (an SSH
  poll blocks for ``ssh.command_timeout_s``) no longer stalls everyone else's
  crash detection, and a slow live node is judged exactly as before.
- A rank whose heartbeat record did not change since the last poll reuses its
  last status; the heartbeat details are rebuilt at most every
  :data:`DETAILS_EVERY_S`; node-loss checks group ranks by node once (they were
  quadratic).
- Above :data:`RANKS_IN_FULL` ranks, an outcome carries only the ranks that say
  something into history (:func:`for_history`).

Limits: everything runs in one Python process, so the GIL caps a worker at about
one core of supervision. Measured (8 ranks per node, 1 s steps, 0.5 s polls):
0.6-0.7 ms of CPU per node per second; 1,000 nodes take 0.7 cores with p99
detection under 2 s, 2,000 a full core and rounds overrun the interval. A larger
job needs its nodes split across several supervise activities (on several
workers): not built. Every poll is still a request and an
answer per node: a stream per node that reports only changes would cut the cost
of the nodes that have nothing to say. A silent node is declared lost no sooner
than ``node_timeout_s`` and two failed polls (two transport timeouts).
The heartbeat details hold one progress mark per rank (about 75 bytes): about
7,000 ranks pass Temporal's 512 KB warning, about 27,000 its 2 MB limit.

A failure that ended a rank, in a job with ``rejoin``, is announced to the
generation's survivors as it is reported (:func:`announce_failure`), beside the
evidence's round trips: a survivor busy in its step tears down then, not when its
rejoin request comes after the resume search and the carry.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from concurrent.futures import Future, ThreadPoolExecutor

from temporalio import activity

from activities.heartbeat import in_thread_heartbeating
from activities.nodes.agent import NodeAgent
from activities.nodes.factory import agents
from activities.observe import observe
from activities.supervise_observer import GenerationObserver
from activities.supervise_rules import (
    HANG_CHECK_SLACK_S,
    Observation,
    StepRate,
    awaiting_exit_record,
    evaluate,
    learned_budget_fired,
    needs_kernel_evidence,
    next_hang_check,
    with_evidence,
)
from lazarus.domain.contracts import (
    FailureReport,
    SuperviseOutcome,
    SuperviseRequest,
    SupervisionProgress,
)
from lazarus.domain.environment import GENERATION_FAILED_FILE
from lazarus.rank.hang_evidence import EvidenceTarget, HangEvidence, evidence_lines
from lazarus.rank.rank_stacks import MAX_RANKS

log = logging.getLogger(__name__)


def attach_evidence(observer: GenerationObserver, outcome: SuperviseOutcome) -> FailureReport:
    """The failure of ``outcome`` with its log lines, kernel records and final class
    (blocking: one or two round trips to the failed rank's node)."""
    failure = outcome.failure
    assert failure is not None
    log_text = observer.evidence_for(failure.rank)
    kernel: list[str] | None = None
    if needs_kernel_evidence(failure):
        pid = next((r.pid for r in outcome.ranks if r.rank == failure.rank), 0)
        kernel = observer.kernel_evidence_for(failure.rank, pid)
    return with_evidence(failure, log_text, kernel)


def with_rank_stacks(observer: GenerationObserver, outcome: SuperviseOutcome) -> FailureReport:
    """A hang's failure with its evidence read where the ranks run
    (:meth:`NodeAgent.hang_evidence`, :mod:`lazarus.rank.hang_evidence`): the Python
    stack of its culprit and a few peers, and every live rank's flight recorder, asked
    of every node that answered the last poll at once, each bounded. Put right after
    the first evidence line: the decisive lines come first, and evidence keeps only its
    first twenty."""
    failure = outcome.failure
    assert failure is not None
    if failure.kind != "hang":
        return failure
    live = [r for r in outcome.ranks if r.alive and r.pid > 0]
    live.sort(key=lambda r: (r.rank != failure.rank, r.rank))
    read = {r.rank for r in live[:MAX_RANKS]}
    by_node: dict[str, tuple[NodeAgent, list[EvidenceTarget]]] = {}
    for r in live:
        agent = observer.answering_agent(r.rank)
        if agent is not None:
            target = EvidenceTarget(r.rank, r.pid, r.stopped_by_signal, r.rank in read)
            by_node.setdefault(agent.node.name, (agent, []))[1].append(target)
    if not by_node:
        return failure
    gen_dir = str(observer.generation_dir)
    with ThreadPoolExecutor(max_workers=len(by_node), thread_name_prefix="hang-evidence") as pool:
        asked = [
            (name, pool.submit(agent.hang_evidence, gen_dir, targets))
            for name, (agent, targets) in by_node.items()  # the culprit's node first
        ]
        lines = evidence_lines(_answer(name, future) for name, future in asked)
    first, *rest = failure.evidence or [""]
    return failure.model_copy(update={"evidence": [first, *lines, *rest]})


ANNOUNCED_KINDS = frozenset({"crash", "vanished", "node_lost"})
"""Failures that ended a rank: its peers cannot go on, whatever the workflow decides
(a hang or a straggler leaves every rank alive, and a generation the workflow keeps
must not be torn down)."""


def announce_failure(
    request: SuperviseRequest, observer: GenerationObserver, failure: FailureReport
) -> list[str]:
    """Write the generation's failure notice (:data:`GENERATION_FAILED_FILE`) on every node that
    answered the last poll, all at once, when the job rejoins and ``failure`` ended a
    rank; the nodes written. A node that cannot be written is logged and skipped: its
    survivors tear down when their collective fails or their request comes, as before.
    Never raises, and bounded by one write per node (the nodes' command timeout)."""
    if request.rejoin_timeout_s is None or failure.kind not in ANNOUNCED_KINDS:
        return []
    by_node: dict[str, NodeAgent] = {}
    for rank in range(request.world_size):
        agent = observer.answering_agent(rank)
        if agent is not None:
            by_node.setdefault(agent.node.name, agent)
    path = str(observer.generation_dir / GENERATION_FAILED_FILE)
    notice = json.dumps({"rank": failure.rank, "kind": failure.kind})

    def write(agent: NodeAgent) -> str | None:
        try:
            agent.write_file(path, notice)
        except Exception as exc:  # a notice only ever speeds a teardown up
            log.warning("failure notice not written on node %s: %s", agent.node.name, exc)
            return None
        return agent.node.name

    if not by_node:
        return []
    with ThreadPoolExecutor(max_workers=len(by_node), thread_name_prefix="notice") as pool:
        return [name for name in pool.map(write, by_node.values()) if name is not None]


def _answer(node: str, future: Future[HangEvidence]) -> HangEvidence:
    """A node's evidence, or one line saying why there is none (an agent's bug must
    not hold up the recovery)."""
    try:
        return future.result()
    except Exception as exc:
        return HangEvidence(stacks=[f"rank stacks on node {node}: not read ({exc!r})"[:400]])


def drain_lost_node(opened: list[NodeAgent], failure: FailureReport, job_id: str) -> FailureReport:
    """A lost Slurm node is drained with a reason an admin can read, so Slurm gives
    it to nobody else either; the outcome (or the refusal: draining needs Slurm admin
    rights) goes into the failure's evidence and never fails the job. Idempotent, so
    a retried supervise that reports the loss again drains again harmlessly."""
    if failure.kind != "node_lost":
        return failure
    agent = next((a for a in opened if a.node.name == failure.node), None)
    done = None if agent is None else agent.drain(failure.failure_class.value, job_id)
    if done is None:  # no such node, or one without a scheduler
        return failure
    return failure.model_copy(update={"evidence": [*failure.evidence, done.evidence()]})


def _previous_memory() -> SupervisionProgress | None:
    details = activity.info().heartbeat_details
    if not details:
        return None
    try:
        return SupervisionProgress.model_validate(details[0])
    except ValueError:
        return None


async def _observe_heartbeating(
    observer: GenerationObserver, last: SupervisionProgress | None
) -> Observation:
    """A silent node makes one poll take up to the command timeout: keep heartbeating
    meanwhile, or Temporal would think this worker died. Before the first observation
    there is no memory to send: those beats carry no details."""
    return await in_thread_heartbeating(observer.observe, lambda: last)


@activity.defn(name="supervise")
async def supervise(request: SuperviseRequest) -> SuperviseOutcome:
    """Watch one generation until it fails, finishes, or has progress worth reporting."""
    with agents(request.access.or_this_machine()) as opened:
        observer = GenerationObserver(request, opened)
        try:
            return await _supervise_with(request, opened, observer)
        finally:
            observer.close()


async def _supervise_with(
    request: SuperviseRequest, opened: list[NodeAgent], observer: GenerationObserver
) -> SuperviseOutcome:
    last = _previous_memory()
    if last is not None and last.generation == request.generation:
        observer.restore(last)
    rate = StepRate()
    started_at = time.time()
    interval = request.health.poll_interval_s
    details_at = 0.0
    save_s_seen: float | None = None
    while True:
        round_started = time.monotonic()
        obs = await _observe_heartbeating(observer, last)
        observe("supervision_poll", time.monotonic() - round_started, job=request.job_id)
        if obs.checkpoint_save_s is not None and obs.checkpoint_save_s != save_s_seen:
            save_s_seen = obs.checkpoint_save_s
            observe("checkpoint_save", save_s_seen, job=request.job_id)
        seconds_per_step = rate.update(obs.ranks)
        outcome = evaluate(request, obs, started_at, seconds_per_step)
        if outcome is not None:
            if outcome.kind == "failed" and outcome.failure is not None:
                notice = asyncio.create_task(
                    asyncio.to_thread(announce_failure, request, observer, outcome.failure)
                )
                failure = await asyncio.to_thread(attach_evidence, observer, outcome)
                outcome = outcome.model_copy(update={"failure": failure})
                failure = await asyncio.to_thread(with_rank_stacks, observer, outcome)
                stopped = any(r.rank == failure.rank and r.stopped_by_signal for r in obs.ranks)
                fired = learned_budget_fired(
                    failure, request.health.hang_timeout_s, culprit_stopped=stopped
                )
                if fired is not None:
                    observer.note_learned_hang(fired)
                failure = await asyncio.to_thread(drain_lost_node, opened, failure, request.job_id)
                outcome = outcome.model_copy(update={"failure": failure})
                await notice
            return for_history(outcome)
        if last is None or time.monotonic() - details_at >= DETAILS_EVERY_S:
            last = observer.heartbeat_details(obs, seconds_per_step)
            details_at = time.monotonic()
        activity.heartbeat(last)
        # A round every poll_interval_s from its start, not interval after its end: a
        # large job's round takes long enough to matter (tenths of a second at 1,000
        # nodes). A rank's end cuts the wait short (its pidfd, where the node is this
        # machine), and a dead rank whose exit record is still being written is asked
        # about again soon: detection waits for neither the round nor the grace.
        # The same for a hang clock about to run out: the round that judges it comes
        # when it does, not up to an interval later.
        delay = interval - (time.monotonic() - round_started)
        if awaiting_exit_record(obs):
            delay = min(delay, EXIT_RECORD_POLL_S)
        delay = min(delay, until_hang_check(request, obs, time.time()))
        due = observer.due_in()  # a silent node's deadline: declared then, not a round later
        if due is not None:
            delay = min(delay, due)
        await until_an_exit(opened, delay)


def until_hang_check(request: SuperviseRequest, obs: Observation, now: float) -> float:
    """Seconds from ``now`` (controller wall time) until the round that judges the
    earliest hang clock (:func:`next_hang_check`, plus :data:`HANG_CHECK_SLACK_S`);
    infinite when none runs. A deadline the observation itself had passed was judged
    by it (the rank was not called hung: a crash is awaiting its exit record), so it
    is left to the rounds: polling at once again would turn the loop into a spin."""
    deadline = next_hang_check(request, obs)
    if deadline is None or deadline < obs.now:
        return math.inf
    return max(deadline - now, 0.0) + HANG_CHECK_SLACK_S


EXIT_RECORD_POLL_S = 0.05
"""How soon a rank seen dead without its exit record is asked about again (its
recorder writes it within milliseconds; its own exit also wakes the supervisor where
pidfds work). The record decides between a crash and a vanished rank."""


async def until_an_exit(opened: list[NodeAgent], delay: float) -> None:
    """Sleep ``delay`` seconds, or less: until a rank (or its recorder) of one of these
    nodes ends, when their agents give exit notices (:meth:`NodeAgent.exit_fds`).

    The event loop waits on the descriptors itself (``add_reader``): no thread, and a
    cancelled activity stops waiting at once. The descriptors that fired are handed
    back to their agents, which close them: a pidfd stays readable once its process
    has ended, and would otherwise end every later wait at once."""
    if delay <= 0:
        return
    loop = asyncio.get_running_loop()
    woken = asyncio.Event()
    fired: dict[int, NodeAgent] = {}
    watched: list[tuple[int, NodeAgent]] = []

    def ended(fd: int, agent: NodeAgent) -> None:
        fired[fd] = agent
        woken.set()

    try:
        for agent in opened:
            for fd in agent.exit_fds():
                try:
                    loop.add_reader(fd, ended, fd, agent)
                except (NotImplementedError, OSError, ValueError):
                    continue  # a loop without add_reader: the round still comes
                watched.append((fd, agent))
        if not watched:
            await asyncio.sleep(delay)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(woken.wait(), delay)
    finally:
        for fd, _ in watched:
            loop.remove_reader(fd)
        for agent in opened:
            mine = [fd for fd, owner in fired.items() if owner is agent]
            if mine:
                agent.exits_seen(mine)


DETAILS_EVERY_S = 2.0
"""The heartbeat details (one progress mark per rank: 8,000 ranks cost a tenth of a
second to build) are rebuilt at most this often; beats in between repeat the last.
Temporal records a beat only every few seconds anyway (80% of the heartbeat
timeout), so the restore memory and the live view lag by at most this much."""

RANKS_IN_FULL = 256
"""Up to this many ranks, an outcome carries every rank's status into history; above,
only the ones that say something (see :func:`for_history`)."""


def for_history(outcome: SuperviseOutcome) -> SuperviseOutcome:
    """The outcome as it goes into workflow history. Every rank's status costs about
    200 bytes, in every outcome: 8,000 ranks made each progress report 1.6 MB, over
    Temporal's 2 MB payload limit at 16,000. A large job keeps the ranks that are
    not plainly running (ended, dead, stopped: all a failure names), rank 0, and the
    first live rank (the workflow asks whether any rank is alive); the live view of
    every rank stays in the activity's heartbeat details, out of history."""
    if len(outcome.ranks) <= RANKS_IN_FULL:
        return outcome
    first_alive = next((r.rank for r in outcome.ranks if r.alive), None)
    kept = [
        r
        for r in outcome.ranks
        if r.rank in (0, first_alive)
        or not r.alive
        or r.exit_code is not None
        or r.stopped_by_signal
    ]
    return outcome.model_copy(update={"ranks": kept})
