"""Slurm's answers for a whole job, shared by its node agents and asked at most
every :data:`QUERY_INTERVAL_S`: at most 1 Slurm command a second per job, whatever
its size.

Why: every supervision round polls every node of the generation at once (one thread
per node, :mod:`activities.supervise_observer`), and each Slurm node's
:meth:`~activities.nodes.slurm.agent.SlurmAgent.poll` needs two facts from
slurmctld: the allocation's steps (``squeue --steps -j J``) and its node's state
(``scontrol show node``). Asked per node, that was 2 commands per node per round:
a 64-node job at the default ``poll_interval_s: 0.5`` sent about 256 RPCs a second,
which sites rate-limit (``rl_enable``) and call an RPC storm. Both answers are the
same for every node, so they are asked once for the job, and not every round:

- **steps**: one ``squeue --steps -j J`` per allocation. The first agent to ask runs
  it; the others that ask while it runs wait for its answer, and those that ask
  within :data:`QUERY_INTERVAL_S` after it started reuse it.
- **node states**: one ``scontrol show node -o n1,n2,...`` for every node asked
  about recently (:data:`NODE_INTEREST_S`), the asking node included. A node new to
  the job (the first round, a spare swapped in) that an answer in flight does not
  cover starts one that does; one Slurm does not list is asked alone, as before,
  for its one-line error.
- **the allocation's state** (``squeue -j J -h -o %T``, the preemption check of
  :mod:`~activities.nodes.slurm.preemption`): shared the same way, and asked only
  when it matters: the steps answer does not show the allocation running, or a poll
  just saw a rank of it end (:meth:`SlurmRounds.rank_ended`; then in an answer
  asked after that, since an allocation that ends takes its ranks with it, and its
  end must win over the crashes it caused).

So a job asks 2 commands per :data:`QUERY_INTERVAL_S` in steady state (1 a second),
whatever its node count and ``poll_interval_s``; ``python -m bench slurm-calls``
counts them.

What a shared answer may not hide, and how it does not:

- **a step that just started.** A poll reads its ranks' pid files first, then the
  steps: read in that order, a step with a pid file is listed unless it ended. A
  shared answer may have been asked before the pid file was written, and would say
  a live rank's step is gone. So absence counts only in an answer asked after the
  caller read its pid files (``asked_after``); otherwise the caller asks again
  (that answer is shared too). In steady state every step is listed and nobody
  asks again; a step such an answer found gone is not asked about again.
- **a write of our own.** ``drain``/``undrain`` (:mod:`~activities.nodes.slurm.drain`)
  call :meth:`SlurmRounds.forget`, so the next poll sees the state they set.
- **a change since the answer** (a node Slurm marks DOWN, a step that vanished, the
  allocation ending) is seen at most :data:`QUERY_INTERVAL_S` plus one poll
  interval after it happened: 2.5 s at the defaults (0.5 s before issue 29 item 6).
  Rank exits, crashes and hangs are read from the shared filesystem (exit, pid and
  heartbeat files) every poll, not from Slurm: they are not delayed.

A failed command (``squeue`` or ``scontrol`` refused, slurmctld down or rate-limiting:
an error, or no steps answer) fails every caller that waited for it (each would have
failed alone), and its failure is shared like an answer: it serves later callers for
the interval, doubled for each failure in a row up to :data:`MAX_BACKOFF_S`, so a
refusing or overloaded slurmctld gets fewer calls, never more (issue 37, N5: before,
each failure was asked again at once, about 12 commands a second for a 64-node job).
The first answer after it restarts at the interval. The cache is per process
(:data:`ROUNDS`): the node agents of one activity are made separately, and two
jobs' supervisions in one allocation share it too. Stops, launches and preflights
do not use it: they need an answer asked after what they did.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from activities.nodes.slurm.commands import (
    SlurmRunner,
    job_state,
    job_steps,
    node_state,
    node_states,
)

QUERY_INTERVAL_S = 2.0
"""How long an answer serves later callers, from when its command started: each
shared command runs at most once per interval (forced answers aside: a launch, a
drain), so the steps and the node states together cost at most 1 command a second
per job, whatever ``poll_interval_s``. It is also how late a change in Slurm may be
seen, plus one poll interval."""
ENDED_MEMORY_S = 60.0
"""How long a rank seen ended is remembered as seen (:meth:`SlurmRounds.rank_ended`):
one still ended after it counts as new once more, a command a minute at most."""
MAX_BACKOFF_S = 16.0
"""The longest a failure serves later callers: the interval doubles for each failure
of one command in a row (2, 4, 8, 16 s), so Slurm that stays down costs about 3
commands every 16 s per job, and one that comes back is asked again within 16 s."""
NODE_INTEREST_S = 10.0
"""A node polled within this long is asked about in every ``scontrol``; one no
longer polled (replaced, the job ended) drops out after it."""

T = TypeVar("T")
Steps = dict[str, tuple[str, str]] | None
NodeStates = dict[str, tuple[set[str], str]]


@dataclass
class _Flight(Generic[T]):
    """One command: in flight until ``done`` is set, then its value or error, and how
    long it serves later callers (``hold``: the interval, longer for a failure)."""

    started: float
    covers: frozenset[str] = frozenset()
    done: threading.Event = field(default_factory=threading.Event)
    value: T | None = None
    error: BaseException | None = None
    failed: bool = False
    hold: float = 0.0

    def usable(self, now: float, asked_after: float | None, wanted: frozenset[str]) -> bool:
        """In flight, or done within its hold and at or after ``asked_after``. A failure
        serves whatever is ``wanted``: Slurm that cannot answer for some nodes cannot
        for any."""
        if asked_after is not None and self.started < asked_after:
            return False
        if not self.done.is_set():
            return wanted <= self.covers
        if self.started < now - self.hold:
            return False
        return self.failed or wanted <= self.covers


class _Shared(Generic[T]):
    """Each key's newest command, joined or reused by callers that accept it, and how
    many of its commands failed in a row (the backoff)."""

    def __init__(
        self,
        clock: Callable[[], float],
        ttl_s: float,
        failed: Callable[[T], bool] = lambda _: False,
    ) -> None:
        self._clock = clock
        self._ttl_s = ttl_s
        self._failed = failed
        self._lock = threading.Lock()
        self._flights: dict[str, _Flight[T]] = {}
        self._failures: dict[str, int] = {}

    def get(
        self,
        key: str,
        fetch: Callable[[frozenset[str]], T],
        *,
        asked_after: float | None = None,
        wanted: frozenset[str] = frozenset(),
        covers: Callable[[], frozenset[str]] = frozenset,
    ) -> tuple[T, float]:
        """The value of a command that is still usable (see :meth:`_Flight.usable`),
        started at or after ``asked_after``, whose ``covers`` include ``wanted`` (run
        now with ``wanted | covers()`` if none is), and when that command started.
        Raises the error of a failed one."""
        with self._lock:
            flight = self._flights.get(key)
            mine = flight is None or not flight.usable(self._clock(), asked_after, wanted)
            if mine:
                flight = _Flight(started=self._clock(), covers=wanted | covers())
                self._flights[key] = flight
        assert flight is not None
        if mine:
            try:
                flight.value = fetch(flight.covers)
            except BaseException as exc:
                flight.error = exc
                raise
            finally:
                self._settle(key, flight)
        flight.done.wait()
        if flight.error is not None:
            raise flight.error
        return flight.value, flight.started  # type: ignore[return-value]

    def _settle(self, key: str, flight: _Flight[T]) -> None:
        """Mark ``flight`` done, with its hold: the interval for an answer; for a
        failure, the interval doubled for each failure in a row before it."""
        failed = flight.error is not None or self._failed(flight.value)  # type: ignore[arg-type]
        with self._lock:
            count = self._failures.get(key, 0) + 1 if failed else 0
            self._failures[key] = count
            flight.failed = failed
            flight.hold = (
                min(self._ttl_s * 2 ** (count - 1), max(MAX_BACKOFF_S, self._ttl_s))
                if failed
                else self._ttl_s
            )
        flight.done.set()

    def forget(self) -> None:
        with self._lock:
            self._flights.clear()
            self._failures.clear()


class SlurmRounds:
    """The shared answers (see the module docstring). ``runner`` runs the commands
    (default: :func:`~activities.nodes.slurm.commands.run_slurm`); ``clock`` is
    monotonic time (tests move it by hand)."""

    def __init__(
        self,
        ttl_s: float = QUERY_INTERVAL_S,
        runner: SlurmRunner | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self._runner = runner
        self._clock = clock
        # No steps answer (None) is a failure too: Slurm could not be asked.
        self._steps: _Shared[Steps] = _Shared(clock, ttl_s, failed=lambda steps: steps is None)
        self._states: _Shared[NodeStates] = _Shared(clock, ttl_s)
        self._job_states: _Shared[str | None] = _Shared(clock, ttl_s)
        self._lock = threading.Lock()
        self._interest: dict[str, float] = {}
        """node -> when it was last asked about (monotonic)."""
        self._ended: dict[str, float] = {}
        """job -> when a poll last saw one of its ranks newly ended (monotonic)."""
        self._ended_ranks: dict[str, dict[str, float]] = {}
        """job -> rank key -> when a poll first saw it ended (kept
        :data:`ENDED_MEMORY_S`)."""

    def now(self) -> float:
        return self._clock()

    def steps(self, job: str, asked_after: float | None = None) -> tuple[Steps, float]:
        """The job's steps (as :func:`~activities.nodes.slurm.commands.job_steps`: None
        when Slurm cannot be asked), from a ``squeue`` started within the TTL (or the
        backoff, after failures) and at or after ``asked_after``; and when that
        ``squeue`` started."""
        return self._steps.get(job, lambda _: job_steps(job, self._runner), asked_after=asked_after)

    def rank_ended(self, job: str, ranks: Iterable[str]) -> None:
        """A poll saw ``ranks`` of ``job`` ended (an exit file, or their step gone);
        each key names the rank and its generation. Only a rank not seen ended before
        counts: a rank that stays ended costs no Slurm command every round."""
        now = self._clock()
        with self._lock:
            seen = self._ended_ranks.setdefault(job, {})
            new = [key for key in ranks if key not in seen]
            if not new:
                return
            for key in [k for k, at in seen.items() if at < now - ENDED_MEMORY_S]:
                del seen[key]
            seen.update(dict.fromkeys(new, now))
            self._ended[job] = now

    def rank_ended_at(self, job: str) -> float | None:
        """When a poll last saw a rank of ``job`` newly ended, if within the interval."""
        with self._lock:
            at = self._ended.get(job)
        return at if at is not None and at >= self._clock() - self.ttl_s else None

    def job_state(self, job: int, asked_after: float | None = None) -> str | None:
        """The allocation's state word, as
        :func:`~activities.nodes.slurm.commands.job_state` says it, from a ``squeue``
        started within the interval and at or after ``asked_after`` (the steps answer
        that made the caller ask: an older state would be older news). Raises
        :class:`~activities.nodes.slurm.commands.SlurmCommandFailed`."""
        state, _ = self._job_states.get(
            str(job), lambda _: job_state(job, self._runner), asked_after=asked_after
        )
        return state

    def node_state(self, node: str, peers: Iterable[str] = ()) -> tuple[set[str], str]:
        """``node``'s state words and reason, as
        :func:`~activities.nodes.slurm.commands.node_state` says them, from one
        ``scontrol`` for every node polled lately and ``peers`` (the generation's
        other nodes, so that the first round asks once too). Raises
        :class:`~activities.nodes.slurm.commands.SlurmCommandFailed`."""
        now = self._clock()
        with self._lock:
            for name in (*peers, node):
                self._interest[name] = now
        states, _ = self._states.get(
            "",
            self._ask_states,
            wanted=frozenset({node}),
            covers=self._interesting,
        )
        found = states.get(node)
        if found is None:  # Slurm did not list it: ask alone, for the one-line error
            return node_state(node, self._runner)
        return found

    def _interesting(self) -> frozenset[str]:
        cutoff = self._clock() - NODE_INTEREST_S
        with self._lock:
            for node in [n for n, at in self._interest.items() if at < cutoff]:
                del self._interest[node]
            return frozenset(self._interest)

    def _ask_states(self, nodes: frozenset[str]) -> NodeStates:
        return node_states(sorted(nodes), self._runner)

    def forget(self) -> None:
        """Drop every shared answer: the next caller asks Slurm (after a drain)."""
        self._steps.forget()
        self._states.forget()
        self._job_states.forget()


ROUNDS = SlurmRounds()
"""The worker process's shared answers."""
