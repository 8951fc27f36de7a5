"""The ``compare``, ``soak`` and ``overhead`` subcommands of ``python -m bench``.

``compare`` is the whole comparison (what ``make bench`` runs): every fault
scenario under both systems, then the overhead figures, then the chaos soak.
``soak`` and ``overhead`` run one part alone. All three share one local stack
per invocation and write one JSON file and, with a soak, one PNG.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import compare_report
from bench.compare import (
    SCENARIOS,
    SYSTEMS,
    CompareConfig,
    CompareContext,
    CompareRun,
    Extra,
    ScenarioPlan,
    System,
    run_compare,
)
from bench.report import RESULTS_DIR

PositiveInt = Callable[[str], int]


def _names(text: str, known: list[str], what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown {what} {', '.join(unknown) or '(none given)'}; choose from {', '.join(known)}"
        )
    return names


def _scenario_names(text: str) -> list[str]:
    import bench.compare_scenarios  # noqa: F401  - registers them

    return _names(text, list(SCENARIOS), "scenario(s)")


def _system_names(text: str) -> list[str]:
    return _names(text, list(SYSTEMS), "system(s)")


def _minutes(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _common(parser: argparse.ArgumentParser, positive_int: PositiveInt) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="tiny jobs and a 15 s soak: checks the harness only"
    )
    parser.add_argument("--json-out", type=Path, help="default: bench/results/<command>-<ts>.json")
    parser.add_argument(
        "--keep-workdir", action="store_true", help="keep the temporary state (logs) for debugging"
    )
    parser.add_argument(
        "--systems",
        type=_system_names,
        default=list(SYSTEMS),
        help=f"comma-separated, from: {','.join(SYSTEMS)} (default: all)",
    )


def _soak_flags(parser: argparse.ArgumentParser, default_minutes: float | None) -> None:
    parser.add_argument(
        "--soak-minutes",
        type=_minutes,
        default=default_minutes,
        help="soak length per system; 0 skips it (default: 10, or 0.25 with --quick)",
    )
    parser.add_argument("--seed", type=int, default=1, help="the soak's fault schedule")
    parser.add_argument("--plot-out", type=Path, help="default: next to the JSON, .png")


def add_commands(commands: Any, positive_int: PositiveInt) -> None:
    compare = commands.add_parser(
        "compare",
        help="the same job and faults under Lazarus and torchrun, then overhead and a soak",
        description="Fault scenarios under both systems, the overhead figures and the chaos "
        "soak; a markdown table and bench/results/compare-<ts>.json.",
    )
    _common(compare, positive_int)
    compare.add_argument("--repeats", type=positive_int, default=3)
    compare.add_argument(
        "--scenarios",
        type=_scenario_names,
        help="comma-separated (default: all; 'none' is not allowed, use --only-extras)",
    )
    compare.add_argument("--steps", type=positive_int, help="training steps per job")
    compare.add_argument("--no-overhead", action="store_true", help="skip the overhead figures")
    _soak_flags(compare, None)

    soak = commands.add_parser(
        "soak", help="the chaos soak alone: random faults about once a minute, ETTR and MTTR"
    )
    _common(soak, positive_int)
    _soak_flags(soak, None)

    overhead = commands.add_parser(
        "overhead", help="controller CPU, history growth, heartbeat cost, fault-free wall time"
    )
    _common(overhead, positive_int)

    show = commands.add_parser(
        "compare-report", help="print the tables of a saved compare/soak/overhead JSON again"
    )
    show.add_argument("json_file", type=Path)


def run(args: argparse.Namespace) -> int:
    from bench import overhead, soak

    if args.command == "compare-report":
        saved, _ = compare_report.load(args.json_file)
        stats = compare_report.summary(saved)
        print(_tables(saved, stats))
        return 0

    config = CompareConfig.quick() if args.quick else CompareConfig()
    if getattr(args, "steps", None) is not None:
        try:
            config = config.with_steps(args.steps)
        except ValueError as exc:
            print(f"python -m bench: {exc}", file=sys.stderr)
            return 2
    systems: list[System] = list(args.systems)
    extras: dict[str, Extra] = {}
    scenarios: list[str] = []
    repeats = 1
    plot_out: Path | None = None
    json_out: Path = args.json_out or RESULTS_DIR / (
        f"{args.command}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    if args.command == "compare":
        import bench.compare_scenarios  # noqa: F401

        scenarios = args.scenarios or list(SCENARIOS)
        repeats = args.repeats
        if not args.no_overhead:
            extras["overhead"] = overhead.measure
    if args.command == "overhead":
        extras["overhead"] = overhead.measure
    if args.command in ("compare", "soak"):
        minutes = args.soak_minutes
        if minutes is None:
            minutes = config.soak_minutes
        if minutes > 0:
            from dataclasses import replace

            config = replace(config, soak_minutes=minutes, seed=args.seed)
            plot_out = args.plot_out or json_out.with_suffix(".png")
            target = plot_out
            soak_systems = [s for s in systems if s != "torchrun_default"]

            async def run_soak(
                ctx: CompareContext, progress: Callable[[str], None]
            ) -> dict[str, Any]:
                return await soak.run_soak(ctx, soak_systems, target, progress)

            extras["soak"] = run_soak
    plan = ScenarioPlan(scenarios=scenarios, systems=systems, repeats=repeats)
    result = run_compare(
        config,
        plan,
        extras,
        keep_workdir=args.keep_workdir,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    stats = compare_report.summary(result)
    data = compare_report.payload(result, stats)
    data["benchmark"] = args.command
    compare_report.write_json(json_out, data)
    print(_tables(result, stats))
    print(f"\nraw results: {json_out}")
    if plot_out is not None and plot_out.exists():
        print(f"soak plot: {plot_out}")
    failed = [r for r in result.results if r.status == "error"]
    failed_extras = [k for k, v in result.extras.items() if "error" in v]
    return 1 if failed or failed_extras else 0


def _tables(run: CompareRun, stats: dict[str, dict[str, dict[str, compare_report.Cell]]]) -> str:
    from bench import overhead, soak

    parts = []
    if run.plan.scenarios:
        parts.append(compare_report.markdown_table(stats))
    if "overhead" in run.extras:
        parts.append(overhead.markdown(run.extras["overhead"], stats))
    if "soak" in run.extras:
        parts.append(soak.markdown(run.extras["soak"]))
    return "\n\n".join(parts)
