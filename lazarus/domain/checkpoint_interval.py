"""The checkpoint interval by Young and Daly: how often to save, given what a save costs
and how often the job fails. Pure arithmetic, no I/O.

A checkpoint every τ seconds of work costs δ seconds of blocked training each time, and
each failure throws away, on average, about half an interval of work. Checkpoint too
often and the saves eat the job; too rarely and the failures do. With ``M`` the job's
mean time between failures:

* Young (1974), first order: ``τ = √(2δM)``.
* Daly (2006), higher order, the one Lazarus uses: ``τ = √(2δM)·[1 + ⅓√(δ/2M) + ⅑(δ/2M)] - δ``
  for ``δ < 2M``, else ``τ = M`` (a save that costs more than two MTBFs cannot be
  amortised: checkpoint once per expected failure).

Daly's published examples (δ = 5 min): τ ≈ 117 min at M = 24 h, ≈ 57 min at 6 h, and
≈ 9.1 min at M = 15 min (``tests/unit/test_checkpoint_interval.py``).

The per-node MTBF prior comes from Llama 3's 54-day run on 16,384 H100s (Meta, 2024):
419 unexpected interruptions, 4.7e-4 per GPU-day, so an 8-GPU node fails about once in
``1 / (4.7e-4 x 8)`` days, 6,383 hours; 2,048 such nodes then fail every 3.1 hours, as
that run did. A job of ``n`` nodes fails ``n`` times as often as one node
(:func:`job_mtbf_s`), and the job's own failures, or a fleet's, move the estimate
(:func:`node_mtbf_h`).
"""

from __future__ import annotations

import math

from pydantic import BaseModel

LLAMA3_FAILURES_PER_GPU_DAY = 4.7e-4
"""Llama 3 405B pre-training: 419 unexpected interruptions in 54 days on 16,384 GPUs."""
GPUS_PER_NODE = 8
LLAMA3_NODE_MTBF_H = 24.0 / (LLAMA3_FAILURES_PER_GPU_DAY * GPUS_PER_NODE)
"""The default per-node MTBF prior, about 6,383 h (an 8-GPU node at Llama 3's rate)."""
PRIOR_WEIGHT_FAILURES = 5.0
"""How many observed failures the MTBF prior is worth (:func:`node_mtbf_h`)."""


def young_interval_s(delta_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum ``√(2δM)``."""
    _check(delta_s, mtbf_s)
    return math.sqrt(2.0 * delta_s * mtbf_s)


def daly_interval_s(delta_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum: ``√(2δM)·[1 + ⅓√(δ/2M) + ⅑(δ/2M)] - δ`` for
    ``δ < 2M``, else ``M``. Seconds of work between the ends of two saves."""
    _check(delta_s, mtbf_s)
    if delta_s >= 2.0 * mtbf_s:
        return mtbf_s
    ratio = delta_s / (2.0 * mtbf_s)
    return (
        math.sqrt(2.0 * delta_s * mtbf_s) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - delta_s
    )


def expected_goodput_loss(
    interval_s: float, delta_s: float, mtbf_s: float, restart_s: float = 0.0
) -> float:
    """The fraction of wall time that is not new work, for a checkpoint every
    ``interval_s`` seconds of work, under Daly's exponential model (failures arrive
    as a Poisson process of mean ``M``; each costs ``restart_s`` plus the work since
    the last save):

        T_wall / T_work = (M / τ) · e^{R/M} · (e^{(τ+δ)/M} - 1)
        loss = 1 - T_work / T_wall

    For ``τ, δ ≪ M`` this is Young's ``δ/τ + τ/2M (+ R/M)``: the saves' cost plus half
    an interval redone per failure. Daly's τ minimises it (to within his expansion)."""
    _check(delta_s, mtbf_s)
    if interval_s <= 0:
        raise ValueError(f"interval_s must be > 0, got {interval_s}")
    if restart_s < 0:
        raise ValueError(f"restart_s must be >= 0, got {restart_s}")
    stretch = (
        (mtbf_s / interval_s)
        * math.exp(restart_s / mtbf_s)
        * math.expm1((interval_s + delta_s) / mtbf_s)
    )
    return 1.0 - 1.0 / stretch


def interval_steps(interval_s: float, seconds_per_step: float) -> int:
    """``interval_s`` of work in whole steps, nearest, at least 1 (``should_checkpoint``
    counts steps; 0 would mean "only on request")."""
    if seconds_per_step <= 0 or not math.isfinite(seconds_per_step):
        raise ValueError(f"seconds_per_step must be > 0, got {seconds_per_step}")
    if interval_s < 0 or not math.isfinite(interval_s):
        raise ValueError(f"interval_s must be >= 0, got {interval_s}")
    return max(1, round(interval_s / seconds_per_step))


def node_mtbf_h(
    prior_h: float,
    *,
    failures: int = 0,
    node_hours: float = 0.0,
    fleet_failures_per_node_hour: float | None = None,
) -> float:
    """The per-node MTBF to plan with, in hours.

    ``fleet_failures_per_node_hour``: a fleet's observed rate across its jobs (the
    fleet workflow's reputation data), when the job belongs to one: it replaces the
    prior, because it is this hardware's own record.

    ``failures`` in ``node_hours``: this job's own record, weighed against the prior
    (or the fleet's rate) as a Gamma prior worth :data:`PRIOR_WEIGHT_FAILURES`
    failures, that is that many MTBFs of exposure at the prior rate: the estimate is
    ``(w + failures) / (w / rate + node_hours)`` failures per node-hour. One unlucky
    crash moves M by a sixth; a 2,048-node job's first days outweigh the prior, as
    they should."""
    if prior_h <= 0:
        raise ValueError(f"prior_h must be > 0, got {prior_h}")
    if failures < 0 or node_hours < 0:
        raise ValueError("failures and node_hours must be >= 0")
    rate = 1.0 / prior_h
    if fleet_failures_per_node_hour is not None and fleet_failures_per_node_hour > 0:
        rate = fleet_failures_per_node_hour
    weight = PRIOR_WEIGHT_FAILURES
    return (weight / rate + node_hours) / (weight + failures)


def job_mtbf_s(node_mtbf_hours: float, nodes: int) -> float:
    """The job's MTBF in seconds: ``nodes`` nodes, each failing independently, fail
    ``nodes`` times as often as one (any node's failure interrupts the whole job)."""
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    return node_mtbf_hours * 3600.0 / nodes


def _check(delta_s: float, mtbf_s: float) -> None:
    if delta_s < 0 or not math.isfinite(delta_s):
        raise ValueError(f"delta_s must be >= 0, got {delta_s}")
    if mtbf_s <= 0 or not math.isfinite(mtbf_s):
        raise ValueError(f"mtbf_s must be > 0, got {mtbf_s}")


class CheckpointIntervalView(BaseModel):
    """What ``checkpoints.interval: auto`` knows and did, as ``status`` shows it and the
    job's state carries it across continue-as-new. Figures are None until measured."""

    checkpoint_save_s: float | None = None
    """δ: the blocking part of a checkpoint, as the ranks measured their last saves."""
    seconds_per_step: float | None = None
    nodes: int = 1
    node_mtbf_h: float = LLAMA3_NODE_MTBF_H
    mtbf_source: str = "prior"
    """Where ``node_mtbf_h`` came from: the prior, a fleet's rate, and this job's record."""
    job_mtbf_s: float = LLAMA3_NODE_MTBF_H * 3600.0
    """M: the job's MTBF, ``node_mtbf_h`` over the node count."""
    optimum_s: float | None = None
    """τ: Daly's optimum interval, seconds of work between saves."""
    every_steps: int | None = None
    """The interval sent to the ranks (None: none sent yet; the script's own applies)."""
    expected_loss: float | None = None
    """The goodput lost to saves and redone work at ``every_steps`` (Daly's model)."""
    sent_generation: int | None = None
    """The generation whose control file holds ``every_steps``: a relaunch writes the
    spec's interval again, so each new generation is sent the tuned one."""
    changes: int = 0
    """How many times an interval was sent (one per change or generation, never per step)."""
    changed_at: float | None = None
    reason: str = ""
    """Why the last interval was sent."""


def short_duration(seconds: float) -> str:
    """``42.0 s``, ``9.1 min``, ``5.2 h``, ``66.5 d``: durations from seconds to months."""
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.2f} s"
