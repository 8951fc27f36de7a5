"""The false-alarm soak (issue 38): no fault at all, only pauses a healthy job makes.

``python -m bench soak --false-alarms`` runs :mod:`bench.false_alarm_job` (2 ranks,
0.1 s steps jittering up to 2x) under Lazarus with the spec's default hang settings
(the learned ``hang_budget``, ``hang_timeout_s`` 60 s), once with the rank helper (its
saves, evaluations and stalls declared) and once as a plain script (``progress_regex``,
nothing declared), through the saves, evaluations, data-loader stalls and planned
restart of :func:`plan`. The first events come once the first generation has had time
to learn its rhythm, so that they meet the learned budget, not ``hang_timeout_s``.

Any hang incident is a false alarm (there is no fault); every other incident is
reported too. The live budget is sampled every second from the supervisor's heartbeat,
so the report says how tight it was when each pause came. Figures:
docs/results/2026-12-hang-budget.md.
"""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from bench.harness import BenchContext, BenchJob
from bench.jobs import JobPaths, flags
from infra.chaos import newest_generation
from lazarus.domain.spec import JobSpec, parse_spec
from workflows.state import Phase

Variant = Literal["helper", "plain"]
JOB = Path(__file__).resolve().parent / "false_alarm_job.py"
PROGRESS_REGEX = r"step (\d+)"
STEP_TIME_S = 0.1
SAVE_S = 3.0
JIT_SAVE_S = 1.0
EVAL_S = 5.0
STALL_S = 2.0
JITTER = 2.0
SAMPLE_EVERY_S = 1.0
PAUSE_TIMEOUT_S = 60.0


def plan(minutes: float) -> dict[str, Any]:
    """The schedule, in seconds from the soak's start (``t0`` is set at the start)."""
    duration = minutes * 60.0
    return {
        "save_every_s": min(60.0, duration / 4),
        "save_s": SAVE_S,
        "jit_save_s": JIT_SAVE_S,
        "eval_at_s": [0.45 * duration, 0.9 * duration],
        "eval_s": EVAL_S,
        "stall_at_s": [0.35 * duration, 0.8 * duration],
        "stall_s": STALL_S,
        "stall_rank": 1,
        "restart_at_s": 0.55 * duration,
        "first_step_s": 3.0,
        "warmup_steps": 5,
        "warmup_s": 1.0,
        "jitter": JITTER,
    }


def _spec(variant: Variant, name: str, paths: JobPaths, schedule_file: Path) -> JobSpec:
    command = [
        sys.executable,
        str(JOB),
        *flags(schedule=schedule_file, workdir=paths.root / "state", step_time=STEP_TIME_S),
    ]
    health: dict[str, object] = {"startup_timeout_s": 120.0}
    checkpoints: dict[str, object] = {}
    if variant == "helper":
        command.append("--helper")
    else:
        health["progress_regex"] = PROGRESS_REGEX
        # A plain script cannot answer the pause's just-in-time request: do not wait
        # the default minute for it.
        checkpoints["jit_timeout_s"] = 2.0
    data: dict[str, object] = {
        "name": name,
        "command": command,
        "workdir": str(paths.root),
        "nproc_per_node": 2,
        "checkpoint_dir": str(paths.checkpoints),
        "run_dir": str(paths.run_dir),
        "env": {"OMP_NUM_THREADS": "1"},
        # The spec's defaults otherwise: hang_timeout_s 60 s, the learned budget.
        "health": health,
        "recovery": {"max_restarts": 100},
        "checkpoints": checkpoints,
    }
    return parse_spec(data, "<bench false-alarm soak>").resolved(paths.root)


async def run(
    ctx: BenchContext,
    variants: Sequence[Variant],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    minutes = ctx.config.soak_minutes
    results = {}
    for variant in variants:
        progress(f"false-alarm soak: {variant} script for {minutes:g} min ...")
        results[variant] = await _one(ctx, variant, minutes, progress)
        r = results[variant]
        progress(
            f"false-alarm soak {variant}: {r['hang_incidents']} hang incidents, "
            f"{r['other_incidents']} other, events {r['event_counts']}, "
            f"final step {r['final_step']}"
        )
    return {"minutes": minutes, "schedule": plan(minutes), "variants": results}


async def _one(
    ctx: BenchContext, variant: Variant, minutes: float, progress: Callable[[str], None]
) -> dict[str, Any]:
    duration = minutes * 60.0
    schedule = plan(minutes)
    state: dict[str, Path] = {}

    def build(name: str, paths: JobPaths) -> JobSpec:
        paths.root.mkdir(parents=True, exist_ok=True)
        schedule_file = paths.root / "schedule.json"
        state["schedule"], state["events"] = schedule_file, paths.root / "state" / "events.jsonl"
        schedule_file.write_text(json.dumps({**schedule, "t0": time.time()}))
        return _spec(variant, name, paths, schedule_file)

    samples: list[tuple[float, str, float]] = []
    restarts: list[dict[str, Any]] = []
    async with ctx.job(f"false-alarms-{variant}", 0, build) as job:
        started = json.loads(state["schedule"].read_text())["t0"]
        restart_due = started + float(schedule["restart_at_s"])
        while time.time() - started < duration:
            if restart_due is not None and time.time() >= restart_due:
                restart_due = None
                restarts.append(await _planned_restart(job, started, progress))
            view = await job.control.jobs.status(job.control.job)
            live = view.live
            if live is not None and live.hang_budget is not None:
                budget = live.hang_budget
                samples.append((time.time() - started, budget.source, budget.budget_s))
            await asyncio.sleep(SAMPLE_EVERY_S)
        status = await job.control.status()
        # The workflow's step is the one its last supervision report carried (minutes
        # old); the logs have the newest, and a plain script's status has none.
        seen = [s for s in (status.step, _logged_step(job.run_root)) if s is not None]
        final_step = max(seen, default=None)
    events = _events(state["events"], started)
    hangs = [i for i in status.incidents if i.kind == "hang"]
    others = [i for i in status.incidents if i.kind != "hang"]
    learned = [b for _, source, b in samples if source == "learned"]
    return {
        "variant": variant,
        "wall_s": duration,
        "hang_incidents": len(hangs),
        "other_incidents": len(others),
        "incidents": [
            {"kind": i.kind, "generation": i.generation, "evidence": i.evidence[:2]}
            for i in status.incidents
        ],
        "generations": status.generation,
        "final_step": final_step,
        "restarts": restarts,
        "events": events,
        "event_counts": dict(Counter(e["kind"] for e in events)),
        "budget_learned_fraction": len(learned) / len(samples) if samples else 0.0,
        "budget_learned_min_s": min(learned, default=None),
        "budget_learned_median_s": statistics.median(learned) if learned else None,
        "budget_learned_max_s": max(learned, default=None),
        "events_under_learned_budget": sum(
            1 for e in events if _source_at(samples, e["at_s"]) == "learned"
        ),
        "samples": samples[:: max(1, len(samples) // 600)],
    }


async def _planned_restart(
    job: BenchJob, started: float, progress: Callable[[str], None]
) -> dict[str, Any]:
    """Pause, then resume: a new generation, with its slow first steps."""
    at = time.time() - started
    try:
        await job.control.pause()
        await asyncio.wait_for(job.wait_phase(Phase.PAUSED), PAUSE_TIMEOUT_S)
        paused = time.time() - started - at
        await job.control.resume()
    except Exception as exc:  # the soak goes on; the report says the restart failed
        progress(f"false-alarm soak: planned restart at {at:.0f} s failed: {exc}")
        return {"at_s": at, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
    progress(f"false-alarm soak: planned restart at {at:.0f} s (paused after {paused:.1f} s)")
    return {"at_s": at, "ok": True, "paused_after_s": paused}


def _logged_step(run_root: Path) -> int | None:
    """The newest ``step N`` line of the newest generation's rank logs (both scripts
    print them)."""
    gen = newest_generation(run_root)
    if gen is None:
        return None
    steps = [
        int(m.group(1))
        for log in gen.path.glob("rank-*.log")
        for m in re.finditer(PROGRESS_REGEX, log.read_text(errors="replace"))
    ]
    return max(steps, default=None)


def _events(path: Path, started: float) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{"kind": e["kind"], "at_s": e["at"] - started, "step": e["step"]} for e in lines]


def _source_at(samples: list[tuple[float, str, float]], at_s: float) -> str | None:
    before = [source for t, source, _ in samples if t <= at_s]
    return before[-1] if before else None


def markdown(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"false-alarm soak failed: {result['error']}"
    rows = [
        f"False-alarm soak, {result['minutes']:g} min per script (no fault injected)",
        "",
        "| script | hang incidents | other incidents | saves / evals / stalls | planned "
        "restarts | events under a learned budget | learned budget (min / median / max) "
        "| time learned | final step |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for variant, r in result["variants"].items():
        c = r["event_counts"]
        budget = (
            "-"
            if r["budget_learned_min_s"] is None
            else f"{r['budget_learned_min_s']:.2f} / {r['budget_learned_median_s']:.2f} / "
            f"{r['budget_learned_max_s']:.2f} s"
        )
        ok = sum(1 for x in r["restarts"] if x["ok"])
        rows.append(
            f"| {variant} | **{r['hang_incidents']}** | {r['other_incidents']} | "
            f"{c.get('checkpoint_save', 0)} / {c.get('evaluation', 0)} / "
            f"{c.get('data_loader_stall', 0)} | {ok}/{len(r['restarts'])} | "
            f"{r['events_under_learned_budget']}/{len(r['events'])} | {budget} | "
            f"{r['budget_learned_fraction']:.0%} | {r['final_step']} |"
        )
    return "\n".join(rows)
