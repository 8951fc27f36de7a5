"""The cost commands' one skeleton (``checkpoints``, ``scale``, ``state-scale``,
``slurm-calls``): their shared flags, timers, results file and table layout. Each
command keeps its own measurement and rows."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
"""Where every command's results file goes unless ``--json-out`` (bench/README.md)."""


def table(
    head: Sequence[str], rows: Iterable[Sequence[object]], align: str | Sequence[str] = "---"
) -> list[str]:
    """A markdown table's lines, the one layout every bench table prints (header,
    separator: ``align`` for every column or one per column, rows), so none
    hand-writes its pipes; a None cell prints as ``-``, the bench's "not measured"."""
    aligns = [align] * len(head) if isinstance(align, str) else align
    return [
        "| " + " | ".join(head) + " |",
        "|" + "".join(f"{a}|" for a in aligns),
        *["| " + " | ".join("-" if c is None else str(c) for c in row) + " |" for row in rows],
    ]


def add_parser(
    name: str, commands: Any, doc: str | None, help: str, nodes: tuple[int, ...] = ()
) -> argparse.ArgumentParser:
    """``python -m bench <name>``, described by ``doc``'s first line, with ``--json-out``
    and, given default ``nodes``, ``--nodes`` (:func:`node_counts`)."""
    parser: argparse.ArgumentParser = commands.add_parser(
        name, help=help, description=(doc or "").splitlines()[0]
    )
    parser.add_argument("--json-out", type=Path, help=f"default: bench/results/{name}-<ts>.json")
    if nodes:
        parser.add_argument(
            "--nodes",
            type=node_counts,
            default=nodes,
            help=f"node counts, comma-separated (default: {','.join(map(str, nodes))})",
        )
    return parser


def node_counts(text: str) -> tuple[int, ...]:
    """``--nodes 100,1000``: node counts, each 1 to 20,000."""
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not counts or any(c < 1 or c > 20_000 for c in counts):
        raise argparse.ArgumentTypeError(f"each count must be 1..20000, got {text!r}")
    return counts


def sizes_mb(text: str) -> list[int]:
    """``--sizes-mb``'s comma-separated MiB."""
    return [int(size) for size in str(text).split(",") if size.strip()]


def timed(action: Callable[[], object]) -> float:
    """Seconds ``action`` took."""
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def results_path(benchmark: str, json_out: Path | None = None) -> Path:
    """``json_out``, or ``bench/results/<benchmark>-<local time>.json``."""
    return json_out or RESULTS / f"{benchmark}-{time.strftime('%Y%m%d-%H%M%S')}.json"


def write_results(
    target: Path, payload: dict[str, Any], table: str, footer: str = "\nraw results: {}"
) -> None:
    """Writes ``payload`` to ``target`` (its folder made), prints ``table``, then
    ``footer`` naming the file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(payload, indent=2) + "\n")
    print(table)
    print(footer.format(target))


def write_cost_results(
    benchmark: str,
    json_out: Path | None,
    load_before: tuple[float, float, float],
    rows: list[dict[str, Any]],
    table: str,
    **fields: Any,
) -> None:
    """A cost benchmark's results file (``bench/results/<benchmark>-<ts>.json`` unless
    ``json_out``): its rows, ``fields`` and the load around the run; prints ``table``."""
    load_after = os.getloadavg()
    document = {
        "benchmark": benchmark,
        **fields,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "cpus": os.cpu_count(),
        "rows": rows,
    }
    footer = f"\nload average before {load_before[0]:.2f}, after {load_after[0]:.2f}\n"
    write_results(results_path(benchmark, json_out), document, table, footer + "raw results: {}")
