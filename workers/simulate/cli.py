"""``lazarus simulate`` (and its alias ``python -m bench simulate``): the options, the
table and the plot of a simulation."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from workers.simulate.model import (
    PROFILES,
    RENDEZVOUS_MODELS,
)
from workers.simulate.runner import SimConfig, simulate, variants
from workers.simulate.watch import (
    TEST_SERVER_DIST,
    TEST_SERVER_NAME,
    find_test_server,
    stopped_by_sigterm,
)


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| configuration | interval | ETTR | MTTR | interruptions | steps lost | events "
        "| continue-as-new |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['variant']} | failed: {r['error']} | | | | | | |")
            continue
        mttr = f"{r['mttr_s']:.0f} s" if r["mttr_s"] is not None else "-"
        name = r["variant"]
        if "overran" in r:
            name += " (overran: terminated a day past the horizon)"
        if "failed" in r:
            name += f" (the job's workflow failed at day {r['failed']['clock_at_day']})"
        if "clock_stopped" in r:
            day = r["clock_stopped"]["clock_stopped_at_day"]
            name += f" (clock stopped at day {day}: figures partial)"
        lines.append(
            f"| {name} | {r['interval_s'] / 60:.1f} min | {100 * r['ettr']:.2f}% | {mttr} "
            f"| {r['interruptions']} | {r['steps_lost']} | {r['history_events']} "
            f"| {r['continue_as_new']} |"
        )
    yd = result["young_daly"]
    lines.append("")
    lines.append(
        f"Young-Daly: δ = {yd['delta_s']:g} s, M = {yd['mtbf_s'] / 3600:.2f} h, "
        f"τ = {yd['tau_s'] / 60:.1f} min. Daly's ceiling (at τ, no restart cost): "
        f"{100 * yd['ettr_ceiling']:.1f}%."
    )
    for what, note in result["notes"].items():
        lines.append(f"- {what}: {note}")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base_spares = result["config"]["spares_pct"]
    rows = [r for r in result["rows"] if "error" not in r]
    curve = sorted(
        (r["interval_s"] / 60, 100 * r["ettr"])
        for r in rows
        if r["lemon_exclusion"]
        and r["spares_pct"] == base_spares
        and r["interval_kind"] in ("fixed", "sweep")
    )
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(
        [p[0] for p in curve],
        [p[1] for p in curve],
        "o-",
        label="fixed interval, lemon exclusion",
    )
    markers = {"fixed": "s", "auto": "*"}
    for r in rows:
        if r["spares_pct"] != base_spares or r["interval_kind"] == "sweep":
            continue
        if r["interval_kind"] == "fixed" and r["lemon_exclusion"]:
            continue  # on the curve
        label = r["variant"] + (
            " (its last tuned interval)" if r["interval_kind"] == "auto" else ""
        )
        ax.plot(
            r["interval_s"] / 60,
            100 * r["ettr"],
            markers[r["interval_kind"]],
            markersize=12 if r["interval_kind"] == "auto" else 8,
            label=label,
        )
    if rows:
        # Daly's expectation beside the simulated points: with no restart cost (the
        # ceiling at this δ) and with the rows' mean MTTR.
        restart = [r["mttr_s"] for r in rows if r["mttr_s"] is not None]
        mean_restart = sum(restart) / len(restart) if restart else 0.0
        config = SimConfig(**{**result["config"], "sweep": (), "rows": ()})
        low = min(r["interval_s"] for r in rows) / 60 * 0.7
        high = max(r["interval_s"] for r in rows) / 60 * 1.4
        xs = [low * (high / low) ** (k / 100) for k in range(101)]
        for label, cost in (("no restart cost", 0.0), (f"MTTR {mean_restart:.0f} s", mean_restart)):
            ax.plot(
                xs,
                [100 * config.daly_ettr(x * 60, cost) for x in xs],
                ls=":" if cost == 0 else "-.",
                color="tab:grey",
                lw=1,
                label=f"Daly's model, {label}",
            )
    ax.axhline(97.0, color="tab:green", ls="--", lw=1, label="97% target")
    tau = result["young_daly"]["tau_s"] / 60
    ax.axvline(tau, color="tab:red", ls="--", label=f"Young-Daly τ = {tau:.1f} min")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (min, log scale)")
    ax.set_ylabel("ETTR (%)")
    cfg = result["config"]
    ax.set_title(
        f"{cfg['nodes']} nodes x {cfg['gpus_per_node']} GPUs, {cfg['days']:g} days, "
        f"{cfg['profile']} profile, δ = {cfg['checkpoint_s']:g} s"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


SUMMARY = (
    "the real JobWorkflow on the time-skipping server: weeks of Llama 3 failures on "
    "thousands of simulated nodes (ETTR, MTTR, history)"
)


def add_command(commands: Any) -> None:
    """``simulate`` as a subcommand of ``commands`` (``python -m bench simulate``)."""
    add_options(commands.add_parser("simulate", help=SUMMARY, description=SUMMARY))


class _Help(argparse.HelpFormatter):
    """``Usage:`` as every other ``lazarus`` verb's help begins."""

    def add_usage(
        self,
        usage: str | None,
        actions: Iterable[argparse.Action],
        groups: Iterable[argparse._MutuallyExclusiveGroup],
        prefix: str | None = None,
    ) -> None:
        super().add_usage(usage, actions, groups, "Usage: " if prefix is None else prefix)


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=SUMMARY, formatter_class=_Help)
    add_options(parser)
    return parser


def add_options(parser: argparse.ArgumentParser) -> None:
    """The one definition of the simulator's options, for both of its commands."""
    defaults = SimConfig()
    parser.add_argument(
        "--quick", action="store_true", help="32 nodes, 12 h, failure rate x100: a smoke run"
    )
    parser.add_argument("--nodes", type=int, help=f"job nodes (default {defaults.nodes})")
    parser.add_argument("--days", type=float, help=f"simulated days (default {defaults.days:g})")
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default=defaults.profile,
        metavar="PROFILE",
        help=f"failure rates: {' or '.join(sorted(PROFILES))} (default {defaults.profile})",
    )
    parser.add_argument("--seed", type=int, help=f"trace seed (default {defaults.seed})")
    parser.add_argument(
        "--rows",
        help="comma-separated configurations to run (default: all), e.g. fixed,auto+lemon",
    )
    parser.add_argument(
        "--checkpoint-s",
        type=float,
        help=f"δ, seconds (default {defaults.checkpoint_s:.2g}, Llama 3's)",
    )
    parser.add_argument(
        "--rendezvous",
        choices=RENDEZVOUS_MODELS,
        metavar="MODEL",
        help=f"how start-up grows with the job: {' or '.join(RENDEZVOUS_MODELS)} "
        f"(default {defaults.rendezvous}; "
        "linear: the model of the figures before)",
    )
    parser.add_argument(
        "--repair-h",
        type=float,
        help=f"hours from a hardware fault to the node repaired (default {defaults.repair_h:g}; "
        "inf: only the paged operator repairs, the model of the figures before)",
    )
    parser.add_argument(
        "--hang-timeout-s",
        type=float,
        help=f"the simulated spec's hang timeout (default {defaults.hang_timeout_s:g}; "
        "the product's default is 60)",
    )
    parser.add_argument(
        "--no-hand-back",
        action="store_true",
        help="the fleet rows' job keeps quarantined nodes until it ends (fleet.hand_back: false)",
    )
    parser.add_argument(
        "--memory-every",
        type=int,
        help="the memory rows' memory_every_steps (default: Young-Daly with the measured "
        "snapshot and replica cost)",
    )
    parser.add_argument(
        "--json-out",
        type=Path,
        help="results file; the plot goes beside it, .png "
        "(default: simulate-<timestamp>.json in the results folder)",
    )


def config_from(args: argparse.Namespace) -> SimConfig:
    config = SimConfig.quick() if args.quick else SimConfig()
    config = replace(config, profile=args.profile)
    if args.seed is not None:
        config = replace(config, seed=args.seed)
    if args.rows:
        config = replace(config, rows=tuple(r.strip() for r in args.rows.split(",")))
        variants(config)  # unknown names: one clear line, nothing started
    if args.nodes is not None:
        config = replace(config, nodes=args.nodes)
    if args.days is not None:
        config = replace(config, days=args.days)
    if args.checkpoint_s is not None:
        config = replace(config, checkpoint_s=args.checkpoint_s)
    if args.rendezvous is not None:
        config = replace(config, rendezvous=args.rendezvous)
    if args.repair_h is not None:
        config = replace(config, repair_h=args.repair_h)
    if args.hang_timeout_s is not None:
        config = replace(config, hang_timeout_s=args.hang_timeout_s)
    if args.memory_every is not None:
        config = replace(config, memory_every_steps=args.memory_every)
    if args.no_hand_back:
        config = replace(config, hand_back=False)
    if config.nodes < 2 or config.days <= 0 or config.checkpoint_s <= 0:
        raise ValueError("--nodes must be >= 2, --days and --checkpoint-s > 0")
    if not config.repair_h > 0:
        raise ValueError("--repair-h must be > 0 (inf: only the operator repairs)")
    if not config.hang_timeout_s >= 2:
        raise ValueError("--hang-timeout-s must be >= 2, as a spec's health.hang_timeout_s")
    return config


def main(
    argv: list[str] | None = None,
    prog: str = "lazarus simulate",
    results: Path = Path("."),
) -> int:
    """Parse ``argv`` and run: ``lazarus simulate`` writes its results into the current
    folder, ``python -m bench simulate`` into ``bench/results/``."""
    return run(build_parser(prog).parse_args(argv), prog, results)


def run(args: argparse.Namespace, prog: str = "lazarus simulate", results: Path = Path(".")) -> int:
    try:
        config = config_from(args)
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if find_test_server() is None:
        print(
            f"{prog}: {TEST_SERVER_NAME}: not found beside "
            f"{sys.executable} nor on PATH (pip install {TEST_SERVER_DIST})",
            file=sys.stderr,
        )
        return 2
    json_out: Path = args.json_out or results / f"simulate-{time.strftime('%Y%m%d-%H%M%S')}.json"
    with tempfile.TemporaryDirectory(prefix="lazarus-sim-"):
        result = asyncio.run(
            stopped_by_sigterm(
                simulate(config, lambda line: print(line, file=sys.stderr, flush=True))
            )
        )
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(result, indent=2) + "\n")
    png = json_out.with_suffix(".png")
    plot(result, png)
    print(markdown(result))
    print(f"\nraw results: {json_out}\nplot: {png}")
    return 0
