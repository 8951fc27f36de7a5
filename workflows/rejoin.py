"""Rejoin in place: which ranks of a failed generation keep their process (issue 16).

Pure policy, unit-tested in ``tests/workflow/test_rejoin_policy.py``; the launcher
carries the ranks over (``activities/nodes/rejoin.py``) and the rank helper
(``lazarus.rank.torch.run_resilient``) tears its process group down and rejoins.

Failure sequences, with ``rejoin: {enabled: true}`` on a 2-rank job:

- **Rank 1 is SIGKILLed at step 57.** Supervision reports a crash; the playbook
  restarts in place. Rank 0's collective fails at once (gloo sees the closed
  socket), it destroys its process group and waits. Plan: rank 0 rejoins. No stop
  is sent: rank 1 is already dead, and the launch of generation g+1 fences
  everything of g except rank 0. Only rank 1 starts (warm where the spec allows);
  rank 0 reads its rejoin request, re-creates the group with the new rank 1, and
  both reload the resume point the controller chose.
- **Node B of A, B, C is lost, a spare S is left.** The playbook replaces the node.
  B died with its link, so no socket closed: A's and C's ranks stay blocked in their
  collective until the process group's timeout (30 minutes by default). The whole
  generation restarts on A, S and C, warm from each node's zygote (the spare's was
  started with the run) and from the memory tier or B's replica on its buddy.
- **The same, with ``rejoin.node_loss``** (the script's collective timeout is short,
  or its ranks abort NCCL on a watchdog): only B is stopped (its ranks may still
  run); S takes B's slot, so every rank keeps its number; A's and C's ranks rejoin
  once their collective fails.
- **Rank 1 is SIGSTOPped.** A hang: rank 0 is blocked in a collective that gloo
  cannot abort, so there is nothing to keep. The whole generation restarts.
- **A survivor never rejoins** (frozen, or it gave up waiting). Supervision of g+1
  reports it hung ``rejoin.timeout_s`` after the launch, and that hang restarts the
  whole generation; a survivor that gave up has exited, which is a crash of its
  own and rejoins the others.
- **No spare left, or the world would shrink.** Rank numbers would change: whole
  generation.
- **A rank fails during the rejoin itself** (the restarted rank, or a survivor,
  dies before the generation's first step). The other survivors are blocked in the
  new generation's rendezvous and cannot read another rejoin request: carrying them
  again cost a whole startup timeout (found by the chaos matrix's
  ``survivor_sigkill@rejoin``). Whole generation (issue 26).

The launch checks each survivor again (alive, ours, no exit record) and starts any
that is not afresh, so a plan is a request, never a promise.

- **The relaunch's preflight changes the nodes** (a node fails its checks: a spare
  takes its slot, or the world shrinks). The plan was made for the nodes as they
  were: a shrink leaves carried rank numbers outside the new world, and a swap would
  carry a quarantined node's survivors as the spare's ranks. The rejoin is dropped
  (:func:`rejoin_dropped`): every rank is stopped and the whole generation restarts
  (issue 26).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lazarus.domain.contracts import FailureReport, LaunchResult
from lazarus.domain.spec import JobSpec
from workflows.playbook import Action
from workflows.state import NodePool

RestartPath = Literal["rejoin", "whole_generation"]
"""How a recovery restarted the ranks: survivors rejoined in place, or every rank restarted."""

REJOIN_ACTIONS = frozenset({Action.RESTART, Action.REPLACE_NODE})
"""Decisions that keep the world as it was, rank for rank."""
REJOIN_KINDS = frozenset({"crash", "node_lost"})
"""Failures whose survivors see a closed connection and can tear down: not a hang."""


@dataclass(frozen=True)
class RejoinPlan:
    ranks: list[int]
    """The ranks to carry into the next generation; empty: the whole generation restarts."""
    why: str
    """One line for the incident: who rejoins, or why nobody does."""

    @property
    def path(self) -> RestartPath:
        return "rejoin" if self.ranks else "whole_generation"


def plan_rejoin(
    spec: JobSpec,
    pool: NodePool,
    failure: FailureReport,
    action: Action,
    generation_live: bool,
    mid_rejoin: bool = False,
    node_loss_rejoins: bool = True,
) -> RejoinPlan:
    """Which ranks keep their process through this recovery (see the module's
    sequences). Call it for jobs with ``rejoin`` on, after the decision and before
    the node pool changes. ``mid_rejoin``: the failed generation carried survivors
    and made no step yet. ``node_loss_rejoins``: ``rejoin.node_loss``, for histories
    recorded since it exists (before, a node loss always rejoined)."""
    whole = "restart: the whole generation"
    if mid_rejoin:
        return RejoinPlan(
            [], f"{whole} (a failure during a rejoin: survivors may be blocked in its rendezvous)"
        )
    if failure.kind == "node_lost" and not node_loss_rejoins:
        return RejoinPlan(
            [],
            f"{whole} (node lost: its peers stay blocked in their collective until the "
            "process group's timeout; rejoin.node_loss is off)",
        )
    if failure.kind not in REJOIN_KINDS:
        return RejoinPlan([], f"{whole} ({failure.kind}: survivors may be blocked in a collective)")
    if action not in REJOIN_ACTIONS:
        return RejoinPlan([], f"{whole} (the playbook chose {action.value})")
    if not generation_live:
        return RejoinPlan([], f"{whole} (no generation is running)")
    per_node = spec.nproc_per_node
    world = len(pool.active) * per_node
    if action == Action.REPLACE_NODE:
        if failure.node is None or failure.node not in pool.active:
            return RejoinPlan([], f"{whole} (the failed node is not in the pool)")
        if not pool.spares:
            return RejoinPlan([], f"{whole} (no spare: the world changes)")
        slot = pool.active.index(failure.node)
        replaced = set(range(slot * per_node, (slot + 1) * per_node))
    else:
        replaced = {failure.rank}
    keep = [r for r in range(world) if r not in replaced]
    if not keep:
        return RejoinPlan([], f"{whole} (no rank survived)")
    return RejoinPlan(
        keep,
        f"rejoin: {_ranks(keep)} {'keep their' if len(keep) > 1 else 'keeps its'} process; "
        f"{_ranks(sorted(replaced))} restart{'' if len(replaced) > 1 else 's'}",
    )


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def rejoin_evidence(result: LaunchResult) -> list[str]:
    """What the relaunch did with the survivors it was asked to carry, for the incident."""
    lines = []
    if result.rejoined:
        pids = {r.rank: r.pid for r in result.ranks}
        kept = ", ".join(
            f"{rank} (pid {pids[rank]})" if rank in pids else str(rank) for rank in result.rejoined
        )
        lines.append(
            f"rejoin: generation {result.generation} carried "
            f"rank{'s' if len(result.rejoined) > 1 else ''} {kept} over in place"
        )
    lines += [f"rejoin: started afresh: {why}" for why in result.rejoin_refused]
    return lines


def rejoin_dropped(planned_on: list[str], launching_on: list[str]) -> str | None:
    """Why a rejoin planned on the nodes ``planned_on`` cannot be carried onto
    ``launching_on``, or None when the nodes are the same, in the same order.

    Any change drops it: a rank's number is its slot (``rank // nproc_per_node``),
    so after a shrink the survivors' numbers may fall outside the new world, and
    after a swap a survivor would act for the spare's slot from a node that has just
    been quarantined (and that a ``lazarus return`` would fence under it)."""
    if planned_on == launching_on:
        return None
    return (
        "restart: the whole generation (the preflight changed the nodes from "
        f"{', '.join(planned_on)} to {', '.join(launching_on) or 'none'} after the "
        "rejoin was planned)"
    )
