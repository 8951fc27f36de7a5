"""Accuracy of the classifier on several labelled folders at once, per folder and family.

Usage::

    python -m tests.accuracy_sets [DIR ...]

Without arguments it scores the shared set (``../shared/failure-logs`` beside the
checkout, when it exists), ``tests/fixtures/failure-logs``,
``tests/fixtures/failure-logs-synthetic``, ``tests/fixtures/failure-logs-hard`` and
``tests/fixtures/failure-logs-holdout``.
Rows of an ``index.jsonl`` that carry a ``family`` field are also reported per family,
and every miss is listed.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from tests.classifier_accuracy import REPO, evaluate, load_samples

SHARED = REPO.parent / "shared" / "failure-logs"
"""The shared labelled set, beside the checkout where a workplace provides one."""
DEFAULT_DIRS = [
    SHARED,
    REPO / "tests" / "fixtures" / "failure-logs",
    REPO / "tests" / "fixtures" / "failure-logs-synthetic",
    REPO / "tests" / "fixtures" / "failure-logs-hard",
    REPO / "tests" / "fixtures" / "failure-logs-holdout",
]


def report(directory: Path) -> list[str]:
    """One line for the folder, one per family, one per miss."""
    samples = load_samples(directory)
    result = evaluate(directory.name, samples)
    lines = [f"{directory!s:<60} {result.correct:>3}/{result.total:<3} {result.accuracy:.3f}"]
    family_of = {s.file: str(s.meta["family"]) for s in samples if "family" in s.meta}
    per_family: dict[str, list[bool]] = defaultdict(list)
    for file, true, predicted in result.pairs:
        if file in family_of:
            per_family[family_of[file]].append(true == predicted)
    for family, hits in sorted(per_family.items()):
        lines.append(f"    {family:<28} {sum(hits):>3}/{len(hits)}")
    lines += [f"    miss {f}: true={t} predicted={p}" for f, t, p in result.mistakes()]
    return lines


def main(argv: list[str]) -> int:
    dirs = [Path(a) for a in argv] or [d for d in DEFAULT_DIRS if (d / "index.jsonl").is_file()]
    for directory in dirs:
        print("\n".join(report(directory)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
