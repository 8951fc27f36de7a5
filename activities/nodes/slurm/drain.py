"""Draining a Slurm node and giving it back: the admin side of a Slurm node's agent.

Draining (``scontrol update``) needs Slurm admin rights, so its refusal is returned,
never raised; a node someone else drained keeps their drain and their reason.
"""

from __future__ import annotations

from activities.nodes.agent import DrainResult, NodeAgent
from activities.nodes.slurm.commands import (
    LOST_STATES,
    SlurmCommandFailed,
    node_state,
    one_line,
    run_slurm,
    slurmd_silent,
)
from activities.nodes.slurm.rounds import ROUNDS

DRAIN_REASON_PREFIX = "lazarus:"
"""How the reasons of Lazarus's own drains start: only those it overwrites or undoes."""


class SlurmDrain(NodeAgent):
    """The drain, undrain and drain-if-lost of
    :class:`~activities.nodes.slurm.agent.SlurmAgent`, for this agent's node
    (``scontrol show node``, then ``scontrol update``)."""

    command_timeout_s: float

    def drain(self, failure_class: str, job: str) -> DrainResult:
        """Take the node out of Slurm's scheduling, with a reason an admin can read.
        Needs Slurm admin rights: a refusal is returned in ``error``, never raised.

        A node someone else already drained is left as it is: their reason (why the
        node is out, who to ask) is worth more to an admin than Lazarus's, and an
        ``scontrol update`` would replace it."""
        reason = f"{DRAIN_REASON_PREFIX} {failure_class} in {job}"
        other = self._drained_by_someone_else()
        if other is not None:
            return DrainResult(
                node=self.node.name,
                drained=False,
                reason=reason,
                left=f"already drained by someone else ({other}); their reason is kept",
            )
        return self._update("drain", reason)

    def drain_if_lost(self, failure_class: str, job: str) -> DrainResult | None:
        """:meth:`drain` when Slurm itself reports the node lost (a launch that could
        not reach it), or when its slurmd refuses connections (dead, though Slurm
        marks it so only after ``SlurmdTimeout``: the drain fences it meanwhile);
        None when it looks fine: a blip is not drained."""
        try:
            words, _ = node_state(self.node.name)
        except SlurmCommandFailed:
            return None
        if words & LOST_STATES or slurmd_silent(self.node.name) is not None:
            return self.drain(failure_class, job)
        return None

    def undrain(self) -> DrainResult:
        """Give a node Lazarus drained back (``lazarus return``), where the rights allow
        it. A node drained by someone else (an admin's maintenance) stays drained:
        their drain is theirs to undo; a node not drained is left alone."""
        try:
            words, reason = node_state(self.node.name)
        except SlurmCommandFailed as exc:
            return DrainResult(node=self.node.name, drained=False, reason="", error=str(exc))
        if "DRAIN" not in words:
            return DrainResult(
                node=self.node.name, drained=False, reason=reason, left="not drained"
            )
        if not reason.startswith(DRAIN_REASON_PREFIX):
            return DrainResult(
                node=self.node.name,
                drained=False,
                reason=reason,
                left=(
                    f"drained by someone else ({reason or 'no reason given'}), not by "
                    "Lazarus: it stays drained until they resume it"
                ),
            )
        return self._update("resume", "")

    def _drained_by_someone_else(self) -> str | None:
        """The reason of a drain not Lazarus's own, or None (not drained, drained by
        Lazarus, or Slurm cannot be asked: the update then says what is wrong)."""
        try:
            words, reason = node_state(self.node.name)
        except SlurmCommandFailed:
            return None
        if "DRAIN" not in words or reason.startswith(DRAIN_REASON_PREFIX):
            return None
        return reason or "no reason given"

    def _update(self, state: str, reason: str) -> DrainResult:
        argv = ["scontrol", "update", f"nodename={self.node.name}", f"state={state}"]
        if reason:
            argv.append(f"reason={reason}")
        try:
            done = run_slurm(argv, self.command_timeout_s)
        except SlurmCommandFailed as exc:
            return DrainResult(node=self.node.name, drained=False, reason=reason, error=str(exc))
        finally:
            ROUNDS.forget()  # the next poll asks Slurm, and sees what this set
        if done.returncode != 0:
            error = one_line(done.stderr or done.stdout) or f"exit {done.returncode}"
            return DrainResult(
                node=self.node.name,
                drained=False,
                reason=reason,
                error=f"scontrol update nodename={self.node.name} state={state}: {error}",
            )
        return DrainResult(node=self.node.name, drained=state == "drain", reason=reason)
