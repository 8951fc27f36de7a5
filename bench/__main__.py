"""``python -m bench``: how fast Lazarus finds and recovers from faults, at what cost,
and how that compares with torchrun.

Every command, with examples, is in bench/README.md. ``recovery``, ``compare``,
``soak``, ``overhead`` and ``slurm`` share one harness (:mod:`bench.harness`), one
scenario registry (:mod:`bench.registry`) and one report (:mod:`bench.report`); the
cost commands (:data:`COST_COMMANDS`) share :mod:`bench.costs`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import (
    catalog,
    checkpoint_bench,
    report,
    scale,
    slurm_calls,
    state_scale,
)
from bench.benchmark import run_benchmark
from bench.costs import progress, results_path
from bench.harness import BenchConfig, BenchRun, Extra
from bench.jobs import JobShape
from bench.registry import SUITES
from bench.systems import DEFAULT_PRELOAD, SLURM_SYSTEMS, SOAK_SYSTEMS, SYSTEMS, System
from workers.simulate import cli as simulate

PROG = "python -m bench"
COST_COMMANDS: dict[str, Any] = {
    "checkpoints": checkpoint_bench,
    "scale": scale,
    "slurm-calls": slurm_calls,
    "state-scale": state_scale,
}
"""The cost commands, each a module with ``add_command(commands)`` (its parser, named
as here) and ``run(args)``: they share :mod:`bench.costs`, not the scenario harness."""


def _names(text: str, known: Sequence[str], what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown {what} {', '.join(unknown) or '(none given)'}; choose from {', '.join(known)}"
        )
    return names


def _lazarus_scenarios(text: str) -> list[str]:
    known = [n for n, s in catalog.load().items() if s.run is not None]
    return _names(text, known, "scenario(s)")


def _any_scenarios(text: str) -> list[str]:
    return _names(text, list(catalog.load()), "scenario(s)")


def _system_names(text: str) -> list[str]:
    return _names(text, list(SYSTEMS), "system(s)")


def _modules(text: str) -> tuple[str, ...]:
    """``--preload``: module names, checked as the spec checks ``warm_start.preload``."""
    from pydantic import ValidationError

    from lazarus.domain.spec import WarmStartSpec

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError("name at least one module (e.g. torch)")
    try:
        WarmStartSpec(preload=list(names))
    except ValidationError as exc:
        reasons = "; ".join(str(e["msg"]) for e in exc.errors())
        raise argparse.ArgumentTypeError(f"warm_start.preload: {reasons}") from None
    return names


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _minutes(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _common(parser: argparse.ArgumentParser, quick_help: str) -> None:
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--json-out", type=Path, help="default: bench/results/<command>-<ts>.json")
    parser.add_argument(
        "--keep-workdir", action="store_true", help="keep the temporary state (logs) for debugging"
    )


def _systems_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--systems",
        type=_system_names,
        default=list(SYSTEMS),
        help=f"comma-separated, from: {','.join(SYSTEMS)} (default: all)",
    )
    parser.add_argument(
        "--preload",
        type=_modules,
        default=DEFAULT_PRELOAD,
        help="the lazarus system's warm_start.preload, comma-separated "
        f"(default: {','.join(DEFAULT_PRELOAD)})",
    )


def _soak_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--soak-minutes",
        type=_minutes,
        default=None,
        help="soak length per system; 0 skips it (default: 10, or 0.25 with --quick)",
    )
    parser.add_argument("--seed", type=int, default=1, help="the soak's fault schedule")
    parser.add_argument("--plot-out", type=Path, help="default: next to the JSON, .png")


def _described(suite: str) -> str:
    scenarios = catalog.load()
    return "Scenarios: " + "; ".join(f"{n}: {scenarios[n].summary}" for n in SUITES[suite])


def _run_flags(
    parser: argparse.ArgumentParser,
    suite: str,
    scenario_names: Callable[[str], list[str]] = _any_scenarios,
    scenarios_help: str | None = None,
    steps_help: str = "training steps per job",
) -> None:
    """``--repeats``, ``--scenarios`` (default: the suite) and ``--steps``: the scenario
    commands' shared options."""
    default = list(SUITES[suite])
    parser.add_argument("--repeats", type=_positive_int, default=3)
    parser.add_argument(
        "--scenarios",
        type=scenario_names,
        default=default,
        help=scenarios_help or f"comma-separated (default: {','.join(default)})",
    )
    parser.add_argument("--steps", type=_positive_int, help=steps_help)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    recovery = commands.add_parser(
        "recovery",
        help="fault scenarios against the example DDP job on a local stack, Lazarus alone",
        description=_described("recovery"),
    )
    _run_flags(
        recovery,
        "recovery",
        _lazarus_scenarios,
        f"comma-separated, from: {','.join(SUITES['recovery'])} (default: all; any "
        "registered scenario Lazarus runs is accepted)",
        "training steps per job (the fault step scales)",
    )
    _common(recovery, "a tiny job (30 steps, 3 s hang timeout): smoke only")

    compare = commands.add_parser(
        "compare",
        help="the same job and faults under Lazarus and torchrun, then overhead and a soak",
        description="Fault scenarios under both systems, the overhead figures and the chaos "
        "soak; a markdown table and bench/results/compare-<ts>.json.",
    )
    quick = "tiny jobs and a 15 s soak: checks the harness only"
    _common(compare, quick)
    _systems_flag(compare)
    _run_flags(compare, "compare")
    compare.add_argument("--no-overhead", action="store_true", help="skip the overhead figures")
    _soak_flags(compare)

    soak = commands.add_parser(
        "soak", help="the chaos soak alone: random faults about once a minute, ETTR and MTTR"
    )
    _common(soak, quick)
    _systems_flag(soak)
    _soak_flags(soak)
    soak.add_argument(
        "--false-alarms",
        action="store_true",
        help="no faults: saves, evaluations, 2x jitter, data stalls and a planned restart "
        "under the learned hang budget; counts hang incidents (issue 38; "
        "bench/soak_false_alarms.py)",
    )
    soak.add_argument(
        "--scripts",
        type=lambda text: _names(text, ["helper", "plain"], "script(s)"),
        default=["helper", "plain"],
        help="--false-alarms: helper (lazarus.rank), plain (progress_regex), or both "
        "(default: helper,plain)",
    )

    overhead = commands.add_parser(
        "overhead", help="controller CPU, history growth, heartbeat cost, fault-free wall time"
    )
    _common(overhead, quick)
    _systems_flag(overhead)

    slurm = commands.add_parser(
        "slurm",
        help="on a test Slurm: node loss under Lazarus and plain Slurm (--requeue), and "
        "the controller's CPU per supervised Slurm node",
        description=_described("slurm"),
    )
    _run_flags(slurm, "slurm")
    slurm.add_argument(
        "--systems",
        type=lambda text: _names(text, list(SLURM_SYSTEMS), "system(s)"),
        default=list(SLURM_SYSTEMS),
        help=f"comma-separated, from: {','.join(SLURM_SYSTEMS)} (default: both)",
    )
    _common(slurm, "a tiny job (30 steps): smoke only")

    show = commands.add_parser(
        "compare-report",
        help="print the tables of a saved recovery/compare/soak/overhead JSON again",
    )
    show.add_argument("json_file", type=Path)
    simulate.add_command(commands)
    for module in COST_COMMANDS.values():
        module.add_command(commands)
    return parser


def _config(args: argparse.Namespace) -> BenchConfig:
    if args.command == "recovery":
        config = BenchConfig.recovery(JobShape.quick() if args.quick else JobShape())
    else:
        config = BenchConfig.quick() if args.quick else BenchConfig()
    if getattr(args, "steps", None) is not None:
        config = config.with_steps(args.steps)
    if getattr(args, "preload", None) is not None:
        config = replace(config, warm_preload=args.preload)
    return config


def _extras(args: argparse.Namespace, config: BenchConfig, json_out: Path) -> dict[str, Extra]:
    """Overhead and soak, as the command asks."""
    from bench import overhead, soak, soak_false_alarms

    extras: dict[str, Extra] = {}
    if args.command == "soak" and args.false_alarms:
        scripts = list(args.scripts)
        extras["false_alarms"] = lambda ctx, progress: soak_false_alarms.run(ctx, scripts, progress)
        return extras
    if (args.command == "compare" and not args.no_overhead) or args.command == "overhead":
        extras["overhead"] = overhead.measure
    if args.command in ("compare", "soak"):
        minutes = config.soak_minutes if args.soak_minutes is None else args.soak_minutes
        if minutes > 0:
            plot_out: Path = args.plot_out or json_out.with_suffix(".png")
            soak_systems: list[System] = [s for s in args.systems if s in SOAK_SYSTEMS]
            extras["soak"] = lambda ctx, progress: soak.run_soak(
                ctx, soak_systems, plot_out, progress
            )
    return extras


def tables(run: BenchRun, stats: report.Summary, benchmark: str) -> str:
    """What a benchmark prints: its scenario table, then overhead and soak tables."""
    from bench import overhead, soak, soak_false_alarms

    if benchmark == "slurm":
        from bench import scenarios_slurm

        return scenarios_slurm.markdown(stats)
    phases = report.phase_tables(stats)
    if benchmark == "recovery":
        table = report.recovery_table(stats, report.skipped(run))
        return table if phases is None else f"{table}\n\n{phases}"
    parts = []
    if run.plan.scenarios:
        parts.append(report.compare_table(stats))
        if phases is not None:
            parts.append(phases)
    if "overhead" in run.extras:
        parts.append(overhead.markdown(run.extras["overhead"], stats))
    if "soak" in run.extras:
        parts.append(soak.markdown(run.extras["soak"]))
    if "false_alarms" in run.extras:
        parts.append(soak_false_alarms.markdown(run.extras["false_alarms"]))
    return "\n\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in COST_COMMANDS:
        return int(COST_COMMANDS[args.command].run(args))
    if args.command == "simulate":  # an alias: the simulator is lazarus simulate
        return simulate.run(args, f"{PROG} simulate", Path("bench/results"))
    if args.command == "compare-report":
        try:
            saved, data = report.load(args.json_file)
        except ValueError as exc:  # names the file already
            print(f"{PROG} compare-report: {exc}", file=sys.stderr)
            return 2
        except (OSError, KeyError) as exc:
            print(f"{PROG} compare-report: {args.json_file}: cannot read: {exc}", file=sys.stderr)
            return 2
        print(tables(saved, report.summary(saved), data["benchmark"]))
        return 0
    try:
        config = _config(args)
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    json_out: Path = results_path(args.command, args.json_out)
    extras = _extras(args, config, json_out)
    if "false_alarms" in extras:
        minutes = 10.0 if args.soak_minutes is None else args.soak_minutes
        if minutes <= 0:
            print(f"{PROG} soak --false-alarms: --soak-minutes must be above 0", file=sys.stderr)
            return 2
        config = replace(config, soak_minutes=minutes)
    elif "soak" in extras:
        minutes = config.soak_minutes if args.soak_minutes is None else args.soak_minutes
        config = replace(config, soak_minutes=minutes, seed=args.seed)
    systems: list[System] = ["lazarus"] if args.command == "recovery" else args.systems
    names: list[str] = getattr(args, "scenarios", [])
    run = run_benchmark(
        [catalog.load()[n] for n in names],
        config,
        getattr(args, "repeats", 1),
        keep_workdir=args.keep_workdir,
        progress=progress,
        systems=systems,
        extras=extras,
        label={"recovery": "bench", "slurm": "slurm"}.get(args.command, "compare"),
    )
    stats = report.summary(run)
    report.write_json(json_out, report.payload(run, stats, args.command))
    print(tables(run, stats, args.command))
    print(f"\nraw results: {json_out}")
    plot = run.extras.get("soak", {}).get("plot")
    if plot and Path(plot).exists():
        print(f"soak plot: {plot}")
    failed = [r for r in run.records if r.error is not None]
    failed_extras = [k for k, v in run.extras.items() if "error" in v]
    return 1 if failed or failed_extras else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; everything started was stopped", file=sys.stderr)
        sys.exit(130)
