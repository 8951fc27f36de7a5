"""``python -m bench state-costs``: what a job's and a fleet's state cost at scale.

Each piece alone, old way and new way side by side in one run: node list bytes (every
field against :class:`lazarus.domain.spec.NodeSpec`'s compact form), the fleet input's
bytes and decode, the update validator's copy (deep against
:func:`lazarus.domain.fleet.scratch_copy`) and the unique-name check (quadratic against
:func:`lazarus.domain.spec.repeated`). Best of ``--repeats``; the ratios are the figures
(docs/results/2026-12-bench-notebook-4.md, "State at scale").
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from temporalio.contrib.pydantic import pydantic_data_converter

from bench import costs
from bench.costs import best_s, node_counts, results_path, write_results
from lazarus.domain.contracts import NodeAccess, SuperviseRequest
from lazarus.domain.fleet import (
    FleetConfig,
    FleetInput,
    LeaseRequest,
    initial_state,
    lease,
    scratch_copy,
)
from lazarus.domain.spec import HealthSpec, NodeSpec, repeated

DEFAULT_NODES = (100, 1_000, 2_048, 4_096)


def full_form(node: NodeSpec) -> dict[str, Any]:
    """A node with every field written: the form history held before."""
    return {name: getattr(node, name) for name in NodeSpec.model_fields}


def quadratic_repeated(names: list[str]) -> list[str]:
    """The unique-name check as it was: ``list.count`` for every name."""
    return sorted({name for name in names if names.count(name) > 1})


def measure(nodes: int, repeats: int) -> dict[str, float | int]:
    converter = pydantic_data_converter.payload_converter
    node_specs = [NodeSpec(name=f"n{i:05d}") for i in range(nodes)]
    spares = [NodeSpec(name=f"s{i:05d}") for i in range(max(1, nodes // 100))]
    request = SuperviseRequest(
        job_id="j", generation=1, run_dir="/r", world_size=8 * nodes, health=HealthSpec()
    )
    (empty,) = converter.to_payloads([request])
    (compact,) = converter.to_payloads(
        [request.model_copy(update={"access": NodeAccess(nodes=node_specs)})]
    )
    full_nodes = json.dumps([full_form(n) for n in node_specs], separators=(",", ":"))

    config = FleetConfig(name="f", nodes=node_specs, spares=spares)
    state = initial_state(config, 0.0)
    lease(state, config, LeaseRequest(job="j", nodes=nodes - len(spares)), 1.0)
    (fleet_payload,) = converter.to_payloads([FleetInput(config=config, state=state)])
    names = [n.name for n in (*node_specs, *spares)]
    figures: dict[str, float | int] = {
        "nodes": nodes,
        "node_list_full_bytes": len(full_nodes),
        "node_list_compact_bytes": len(compact.data) - len(empty.data),
        "fleet_input_bytes": len(fleet_payload.data),
        "fleet_input_decode_s": best_s(
            lambda: converter.from_payloads([fleet_payload], [FleetInput]), repeats
        ),
        "validator_deep_copy_s": best_s(lambda: state.model_copy(deep=True), repeats),
        "validator_scratch_copy_s": best_s(lambda: scratch_copy(state), repeats),
        "name_check_quadratic_s": best_s(lambda: quadratic_repeated(names), repeats),
        "name_check_linear_s": best_s(lambda: repeated(names), repeats),
    }
    figures["node_list_ratio"] = (
        figures["node_list_full_bytes"] / figures["node_list_compact_bytes"]
    )
    figures["validator_copy_ratio"] = (
        figures["validator_deep_copy_s"] / figures["validator_scratch_copy_s"]
    )
    figures["name_check_ratio"] = figures["name_check_quadratic_s"] / figures["name_check_linear_s"]
    return figures


def markdown(rows: list[dict[str, float | int]]) -> str:
    lines = [
        "| nodes | node list, every field / compact (KB) | fleet input (KB), decode (s) "
        "| validator copy, deep / scratch (ms) | name check, quadratic / linear (ms) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['nodes']} "
            f"| {r['node_list_full_bytes'] / 1e3:.0f} / {r['node_list_compact_bytes'] / 1e3:.0f} "
            f"({r['node_list_ratio']:.1f}x) "
            f"| {r['fleet_input_bytes'] / 1e3:.0f}, {r['fleet_input_decode_s']:.3f} "
            f"| {r['validator_deep_copy_s'] * 1e3:.0f} / {r['validator_scratch_copy_s'] * 1e3:.1f} "
            f"({r['validator_copy_ratio']:.0f}x) "
            f"| {r['name_check_quadratic_s'] * 1e3:.0f} / {r['name_check_linear_s'] * 1e3:.2f} "
            f"({r['name_check_ratio']:.0f}x) |"
        )
    return "\n".join(lines)


def add_command(commands: Any) -> None:
    parser = costs.add_parser(
        "state-costs",
        commands,
        __doc__,
        help="a job's and a fleet's state at scale: node list bytes, fleet decode, "
        "validator copy and name check, before and after, side by side",
        json_help="default: bench/results/state-costs-<ts>.json",
    )
    parser.add_argument(
        "--nodes",
        type=node_counts,
        default=DEFAULT_NODES,
        help=f"node counts, comma-separated (default: {','.join(map(str, DEFAULT_NODES))})",
    )
    parser.add_argument("--repeats", type=int, default=5, help="best of this many (default 5)")
    parser.add_argument(
        "--quick", action="store_true", help="100 nodes, 1 repeat: checks the bench"
    )


def run(args: argparse.Namespace) -> int:
    counts: tuple[int, ...] = (100,) if args.quick else args.nodes
    repeats = 1 if args.quick else max(1, args.repeats)
    rows = [measure(nodes, repeats) for nodes in counts]
    payload = {"benchmark": "state-costs", "repeats": repeats, "rows": rows}
    write_results(results_path("state-costs", args.json_out), payload, markdown(rows))
    return 0
