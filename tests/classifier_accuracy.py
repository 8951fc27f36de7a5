"""Accuracy of :func:`lazarus.domain.classifier.classify` on labelled failure logs.

Usage::

    python -m tests.classifier_accuracy [--json] [--ablation] [DIR]

``DIR`` (default ``tests/fixtures/failure-logs``) holds ``NNN.log`` files and an
``index.jsonl`` with ``file`` / ``class`` / ``exit_code`` per line. The report has
overall accuracy, a confusion matrix (rows = true class, columns = predicted),
per-class precision / recall, and a robustness section that tries to estimate how
the rules generalise to logs they were not written against:

* ``synthetic``: accuracy on ``tests/fixtures/failure-logs-synthetic``, snippets
  *written by the Lazarus authors* (not copied from real reports) from the real
  message wordings of PyTorch, NCCL, Slurm, etc. They are reported per batch. Both
  batches were scored once before any rule was changed because of them (batch 1:
  64/66, batch 2, written after the rules were frozen: 33/38); those first-pass
  numbers, recorded in that folder's README, are the honest estimate. The numbers
  printed here are after the fixes, so they are optimistic.
* ``perturbed``: the same logs hard-wrapped at 80 columns, as logs pasted into
  issues often are, and with ``[rankN]:`` / timestamp prefixes stripped.
* ``ablation`` (``--ablation``): accuracy with each rule removed in turn; shows how
  many logs hinge on a single rule.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lazarus.domain import classifier
from lazarus.domain.classifier import classify

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DIR = REPO / "tests" / "fixtures" / "failure-logs"
SYNTHETIC_DIR = REPO / "tests" / "fixtures" / "failure-logs-synthetic"

LABELS = [
    "nccl_timeout",
    "nccl_error",
    "gpu_hardware",
    "oom_gpu",
    "oom_host",
    "user_code",
    "rendezvous",
    "storage",
    "preempted",
    "numerical",
]


@dataclass
class Sample:
    file: str
    label: str
    text: str
    exit_code: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    name: str
    pairs: list[tuple[str, str, str]]  # (file, true, predicted)

    @property
    def total(self) -> int:
        return len(self.pairs)

    @property
    def correct(self) -> int:
        return sum(t == p for _, t, p in self.pairs)

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0

    def mistakes(self) -> list[tuple[str, str, str]]:
        return [x for x in self.pairs if x[1] != x[2]]

    def per_class(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for label in self.labels():
            tp = sum(t == label and p == label for _, t, p in self.pairs)
            predicted = sum(p == label for _, _, p in self.pairs)
            support = sum(t == label for _, t, _ in self.pairs)
            precision = tp / predicted if predicted else 0.0
            recall = tp / support if support else 0.0
            f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
            out[label] = {
                "precision": round(precision, 3),
                "recall": round(recall, 3),
                "f1": round(f1, 3),
                "support": support,
            }
        return out

    def labels(self) -> list[str]:
        seen = {t for _, t, _ in self.pairs} | {p for _, _, p in self.pairs}
        extra = sorted(seen - set(LABELS))
        return [lbl for lbl in LABELS if lbl in seen] + extra

    def confusion(self) -> dict[str, dict[str, int]]:
        counts = Counter((t, p) for _, t, p in self.pairs)
        labels = self.labels()
        return {t: {p: counts[(t, p)] for p in labels} for t in labels}


def load_samples(directory: Path) -> list[Sample]:
    """Read ``index.jsonl`` and the logs it names."""
    samples = []
    with (directory / "index.jsonl").open(encoding="utf-8") as fh:
        for raw in fh:
            if not raw.strip():
                continue
            row = json.loads(raw)
            text = (directory / row["file"]).read_text(encoding="utf-8", errors="replace")
            meta = {k: v for k, v in row.items() if k not in {"file", "class", "exit_code"}}
            samples.append(Sample(row["file"], row["class"], text, row.get("exit_code"), meta))
    return samples


def evaluate(
    name: str,
    samples: Iterable[Sample],
    transform: Callable[[str], str] = lambda t: t,
    use_exit_code: bool = False,
) -> Report:
    pairs = []
    for s in samples:
        exit_code = s.exit_code if use_exit_code else None
        predicted = classify(transform(s.text), exit_code=exit_code).failure_class
        pairs.append((s.file, s.label, str(predicted)))
    return Report(name, pairs)


# ---------------------------------------------------------------- perturbations


def hard_wrap(text: str, width: int = 80) -> str:
    """Break every line at ``width`` columns, mid-word, like a narrow terminal."""
    out: list[str] = []
    for line in text.split("\n"):
        out.extend(line[i : i + width] for i in range(0, max(len(line), 1), width))
    return "\n".join(out)


_PREFIX_RE = re.compile(
    r"^(?:\d+:\s*)?(?:\[rank\d+\]:\s*)?(?:\[?[EWIF]\d{4}\s+[\d:.]+(?:\s+\d+)?\s+\S+\]\s*)?",
    re.MULTILINE,
)


def strip_prefixes(text: str) -> str:
    """Drop ``[rankN]:`` and glog-style ``E0923 04:11:52.118 123 file.cpp:607]`` prefixes."""
    return _PREFIX_RE.sub("", text)


# ---------------------------------------------------------------- ablation


def ablation(samples: list[Sample]) -> list[dict[str, Any]]:
    """Accuracy with each rule removed in turn, worst first."""
    rules = classifier._RULES
    base = evaluate("base", samples).correct
    rows = []
    try:
        for i, rule in enumerate(rules):
            classifier._RULES = rules[:i] + rules[i + 1 :]
            lost = base - evaluate("ablate", samples).correct
            if lost:
                rows.append(
                    {
                        "class": str(rule.failure_class),
                        "pattern": rule.pattern.pattern[:70],
                        "logs_lost": lost,
                    }
                )
    finally:
        classifier._RULES = rules
    return sorted(rows, key=lambda r: -int(r["logs_lost"]))


# ---------------------------------------------------------------- formatting

_SHORT = {
    "nccl_timeout": "ncTO",
    "nccl_error": "ncER",
    "gpu_hardware": "gpHW",
    "oom_gpu": "oGPU",
    "oom_host": "oHST",
    "user_code": "user",
    "rendezvous": "rdzv",
    "storage": "stor",
    "preempted": "prmt",
    "numerical": "nume",
    "unknown": "unkn",
    "hang": "hang",
    "node_lost": "node",
}


def format_confusion(report: Report) -> str:
    labels = report.labels()
    matrix = report.confusion()
    corner = "true \\ pred"
    head = f"{corner:<16}" + "".join(f"{_SHORT.get(p, p[:4]):>6}" for p in labels)
    lines = [head]
    for t in labels:
        cells = "".join(f"{matrix[t][p] or '.':>6}" for p in labels)
        lines.append(f"{t:<16}{cells}")
    return "\n".join(lines)


def format_per_class(report: Report) -> str:
    lines = [f"{'class':<16}{'precision':>10}{'recall':>8}{'f1':>7}{'n':>5}"]
    for label, m in report.per_class().items():
        lines.append(
            f"{label:<16}{m['precision']:>10.2f}{m['recall']:>8.2f}{m['f1']:>7.2f}"
            f"{int(m['support']):>5}"
        )
    return "\n".join(lines)


def _summary(report: Report) -> dict[str, Any]:
    return {
        "accuracy": round(report.accuracy, 4),
        "correct": report.correct,
        "total": report.total,
        "mistakes": [{"file": f, "true": t, "predicted": p} for f, t, p in report.mistakes()],
    }


# ---------------------------------------------------------------- main


def run(directory: Path, with_ablation: bool = False) -> dict[str, Any]:
    samples = load_samples(directory)
    t0 = time.perf_counter()
    main = evaluate(directory.name, samples)
    elapsed = time.perf_counter() - t0
    result: dict[str, Any] = {
        "dir": str(directory),
        **_summary(main),
        "ms_per_log": round(1000 * elapsed / max(len(samples), 1), 3),
        "confusion": main.confusion(),
        "per_class": main.per_class(),
        "with_exit_code": _summary(evaluate("exit", samples, use_exit_code=True)),
        "robustness": {},
        "_reports": {"main": main},
    }
    rob: dict[str, Any] = result["robustness"]
    rob["hard_wrap_80"] = _summary(evaluate("wrap", samples, hard_wrap))
    rob["prefixes_stripped"] = _summary(evaluate("strip", samples, strip_prefixes))
    if SYNTHETIC_DIR.is_dir() and SYNTHETIC_DIR.resolve() != directory.resolve():
        synthetic = load_samples(SYNTHETIC_DIR)
        rep = evaluate("synthetic", synthetic)
        result["_reports"]["synthetic"] = rep
        rob["synthetic"] = _summary(rep)
        rob["synthetic"]["per_class"] = rep.per_class()
        for batch in sorted({s.meta.get("batch", 1) for s in synthetic}):
            part = [s for s in synthetic if s.meta.get("batch", 1) == batch]
            rob[f"synthetic_batch_{batch}"] = _summary(evaluate(f"batch{batch}", part))
        rob["synthetic_hard_wrap_80"] = _summary(evaluate("swrap", synthetic, hard_wrap))
    if with_ablation:
        rob["ablation_rules_that_matter"] = ablation(samples)
    return result


def _print_text(result: dict[str, Any]) -> None:
    main: Report = result["_reports"]["main"]
    print(f"Classifier accuracy on {result['dir']}")
    print(f"  accuracy: {main.accuracy:.3f} ({main.correct}/{main.total})")
    print(f"  with exit codes from index: {result['with_exit_code']['accuracy']:.3f}")
    print(f"  time: {result['ms_per_log']} ms per log\n")
    print("Confusion matrix (rows = true class, columns = predicted):")
    print(format_confusion(main), "\n")
    print("Per class:")
    print(format_per_class(main), "\n")
    for f, t, p in main.mistakes():
        print(f"  MISS {f}: true={t} predicted={p}")
    print("Robustness (estimates of generalisation):")
    for key, value in result["robustness"].items():
        if key == "ablation_rules_that_matter":
            print(f"  ablation: {len(value)} rules are each the only support of some log")
            for row in value[:10]:
                print(f"    -{row['logs_lost']} {row['class']:<13} {row['pattern']}")
            continue
        print(f"  {key:<24} {value['accuracy']:.3f} ({value['correct']}/{value['total']})")
        for m in value["mistakes"][:8]:
            print(f"      miss {m['file']}: true={m['true']} predicted={m['predicted']}")
    if "synthetic" in result["_reports"]:
        print("\nSynthetic set (written by us) confusion matrix:")
        print(format_confusion(result["_reports"]["synthetic"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", nargs="?", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--json", action="store_true", help="print a JSON report")
    parser.add_argument("--ablation", action="store_true", help="leave-one-rule-out check")
    args = parser.parse_args(argv)
    result = run(args.dir, with_ablation=args.ablation)
    if args.json:
        public = {k: v for k, v in result.items() if not k.startswith("_")}
        json.dump(public, sys.stdout, indent=2)
        print()
    else:
        _print_text(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "LABELS",
    "Report",
    "Sample",
    "evaluate",
    "format_confusion",
    "format_per_class",
    "load_samples",
    "run",
]
