"""GPU health from the text a preflight health command printed.

The health command is the operator's (``nvidia-smi -q``, a CSV query, a script
that also greps ``dmesg`` for Xid lines); Lazarus only needs three facts from it
to keep a sick node out of a launch: how many GPUs answered, whether any has
uncorrectable ECC errors since the driver loaded, and whether the kernel logged
Xid errors. Only *volatile* ECC counters count: the aggregate ones are the card's
lifetime and would make every old GPU look faulty. nvidia-smi's text format is
not stable across drivers, so parsing is lenient: anything unrecognised is
ignored rather than failing the node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from activities.nodes.agent import GpuHealth

MAX_DETAILS = 20

# `GPU 00000000:07:00.0` opens each GPU's block in `nvidia-smi -q`.
_GPU_HEADER = re.compile(
    r"^GPU\s+(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$"
)
# Keys are padded with spaces up to the colon: `    Product Name     : NVIDIA A100`.
_KEY_VALUE = re.compile(r"^(?P<key>\S.*?)\s+:\s*(?P<value>.*)$")
_ATTACHED = re.compile(r"^Attached GPUs\s+:\s*(?P<n>\d+)\s*$", re.MULTILINE)
# dmesg: `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.`
_XID = re.compile(r"NVRM: Xid \((?P<where>[^)]*)\): (?P<code>\d+)(?:,\s*(?P<rest>.*))?")
_CSV_COLUMN = re.compile(r"^[a-z][a-z0-9_.]*(?: \[[^\]]*\])?$")
_ECC_COLUMN = "ecc.errors.uncorrected.volatile"


@dataclass
class _Parsed:
    count: int = 0
    ecc: int = 0
    details: list[str] = field(default_factory=list)


def parse_gpu_health(text: str) -> GpuHealth | None:
    """GPU count, volatile uncorrectable ECC errors and Xid lines; None when the text
    holds no nvidia-smi output and no Xid line (a health command about something else)."""
    parsed = _parse_query(text) or _parse_csv(text)
    xid_details = _xid_details(text)
    if parsed is None and not xid_details:
        return None
    parsed = parsed or _Parsed()
    details = (parsed.details + xid_details)[:MAX_DETAILS]
    return GpuHealth(
        count=parsed.count, ecc_errors=parsed.ecc, xid_errors=len(xid_details), details=details
    )


def parse_nvidia_smi(text: str) -> GpuHealth | None:
    """The name the local preflight checks use; same parser."""
    return parse_gpu_health(text)


def gpu_problems(health: GpuHealth, node: str) -> list[str]:
    """Preflight problem lines: a GPU with uncorrectable errors corrupts training
    silently or crashes it later, so the node is replaced rather than launched on."""
    problems: list[str] = []
    if health.ecc_errors:
        problems.append(
            f"gpu: {health.ecc_errors} uncorrectable ECC error(s) since the driver loaded on "
            f"node {node}; reset the GPU (nvidia-smi -r) or drain the node"
        )
    if health.xid_errors:
        problems.append(
            f"gpu: {health.xid_errors} Xid error line(s) on node {node}; see "
            "https://docs.nvidia.com/deploy/xid-errors/ and drain the node if they persist"
        )
    return problems


def _parse_query(text: str) -> _Parsed | None:
    """`nvidia-smi -q`: sections are nested by indentation; ECC counters live under
    ECC Errors > Volatile, as `... Uncorrectable[ Parity| SEC-DED] : N` (Ampere and
    later) or Double Bit > Total (Kepler to Volta)."""
    lines = text.splitlines()
    if not any(_GPU_HEADER.match(line) for line in lines) and not _ATTACHED.search(text):
        return None
    result = _Parsed()
    gpu: str | None = None
    gpu_ecc = 0
    stack: list[tuple[int, str]] = []

    def close_gpu() -> None:
        if gpu is not None and gpu_ecc:
            result.details.append(
                f"GPU {gpu}: {gpu_ecc} uncorrectable ECC error(s) since the driver loaded"
            )

    for raw in lines:
        if not raw.strip():
            continue
        header = _GPU_HEADER.match(raw)
        if header:
            close_gpu()
            gpu, gpu_ecc, stack = header.group("bus"), 0, []
            result.count += 1
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        line = raw.strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        match = _KEY_VALUE.match(line)
        if match is None:
            stack.append((indent, line))
            continue
        if gpu is None:
            continue
        path = [name for _, name in stack]
        if "ECC Errors" not in path or "Volatile" not in path:
            continue
        key = match.group("key")
        counts = "Uncorrectable" in key or ("Double Bit" in path and key == "Total")
        value = match.group("value").strip()
        if counts and value.isdigit():
            gpu_ecc += int(value)
            result.ecc += int(value)
    close_gpu()
    if result.count == 0:
        attached = _ATTACHED.search(text)
        result.count = int(attached.group("n")) if attached else 0
    return result


def _parse_csv(text: str) -> _Parsed | None:
    """`nvidia-smi --query-gpu=...,ecc.errors.uncorrected.volatile.total --format=csv`:
    one row per GPU under a header naming the fields. Without the header
    (`noheader`) the columns cannot be trusted, so that output is not read."""
    lines = text.splitlines()
    for start, line in enumerate(lines):
        columns = [c.strip() for c in line.split(",")]
        if not columns or not all(_CSV_COLUMN.match(c) for c in columns):
            continue
        names = [c.split(" [")[0] for c in columns]
        if not any("." in n or n in ("index", "name", "uuid") for n in names):
            continue
        ecc_columns = _ecc_columns(names)
        result = _Parsed()
        for row in lines[start + 1 :]:
            cells = [c.strip() for c in row.split(",")]
            if len(cells) != len(columns):
                break
            result.count += 1
            label = _row_label(names, cells, result.count - 1)
            errors = sum(int(cells[i]) for i in ecc_columns if cells[i].isdigit())
            if errors:
                result.ecc += errors
                result.details.append(
                    f"GPU {label}: {errors} uncorrectable ECC error(s) since the driver loaded"
                )
        return result
    return None


def _ecc_columns(names: list[str]) -> list[int]:
    """The total when queried, else every per-location counter (never both: the
    total already sums them)."""
    total = [i for i, n in enumerate(names) if n == f"{_ECC_COLUMN}.total"]
    if total:
        return total
    return [i for i, n in enumerate(names) if n.startswith(f"{_ECC_COLUMN}.")]


def _row_label(names: list[str], cells: list[str], position: int) -> str:
    for wanted in ("pci.bus_id", "index", "uuid"):
        if wanted in names:
            return cells[names.index(wanted)]
    return str(position)


def _xid_details(text: str) -> list[str]:
    details: list[str] = []
    for match in _XID.finditer(text):
        what = (match.group("rest") or "").strip()
        suffix = f": {what}" if what else ""
        details.append(f"Xid {match.group('code')} ({match.group('where')}){suffix}"[:200])
    return details
