"""``python -m bench``: how fast Lazarus finds and recovers from faults, at what cost,
and how that compares with torchrun.

Examples::

    python -m bench recovery                          # every scenario, 3 repeats
    python -m bench recovery --scenarios crash,hang --repeats 5
    python -m bench recovery --quick --repeats 1      # a tiny job: checks the harness only
    python -m bench compare                           # Lazarus vs torchrun, overhead, soak
    python -m bench compare --scenarios crash,hang --repeats 5 --soak-minutes 0
    python -m bench soak --soak-minutes 10 --seed 1   # the chaos soak alone
    python -m bench overhead                          # controller and helper costs alone
    python -m bench checkpoints --size-mb 512         # checkpoint write/verify/S3 tiering costs
    python -m bench chaos                             # the fault x phase matrix, as a table
    python -m bench chaos --cells smoke               # its fast subset (as in make test)

Prints a markdown table (median, min and max over repeats) and writes every raw
number to ``bench/results/<benchmark>-<timestamp>.json`` (or ``--json-out``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from bench import chaos, checkpoint_bench, compare_cli, report
from bench.harness import run_benchmark
from bench.jobs import JobShape
from bench.scenarios import SCENARIOS


def _scenario_names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown scenario(s) {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(SCENARIOS)}"
        )
    return names


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    recovery = commands.add_parser(
        "recovery",
        help="fault scenarios against the example DDP job on a local stack",
        description="Scenarios: " + "; ".join(f"{s.name}: {s.summary}" for s in SCENARIOS.values()),
    )
    recovery.add_argument("--repeats", type=_positive_int, default=3)
    recovery.add_argument(
        "--scenarios",
        type=_scenario_names,
        default=list(SCENARIOS),
        help=f"comma-separated, from: {','.join(SCENARIOS)} (default: all)",
    )
    recovery.add_argument("--json-out", type=Path, help="default: bench/results/recovery-<ts>.json")
    recovery.add_argument(
        "--steps", type=_positive_int, help="training steps per job (the fault step scales)"
    )
    recovery.add_argument(
        "--quick", action="store_true", help="a tiny job (30 steps, 3 s hang timeout): smoke only"
    )
    recovery.add_argument(
        "--keep-workdir", action="store_true", help="keep the temporary state (logs) for debugging"
    )
    compare_cli.add_commands(commands, _positive_int)
    checkpoint_bench.add_command(commands)
    chaos.add_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "checkpoints":
        return checkpoint_bench.run(args)
    if args.command == "chaos":
        return chaos.run(args)
    if args.command != "recovery":
        return compare_cli.run(args)
    shape = JobShape.quick() if args.quick else JobShape()
    if args.steps is not None:
        try:
            shape = shape.with_steps(args.steps)
        except ValueError as exc:
            print(f"python -m bench: {exc}", file=sys.stderr)
            return 2
    bench = run_benchmark(
        [SCENARIOS[name] for name in args.scenarios],
        shape,
        args.repeats,
        keep_workdir=args.keep_workdir,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    stats = report.summary(bench)
    json_out: Path = args.json_out or report.default_json_path()
    report.write_json(json_out, report.payload(bench, stats))
    print(report.markdown_table(stats, report.skipped(bench)))
    print(f"\nraw results: {json_out}")
    failed = [r for r in bench.records if r.error is not None]
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("python -m bench: interrupted; everything started was stopped", file=sys.stderr)
        sys.exit(130)
