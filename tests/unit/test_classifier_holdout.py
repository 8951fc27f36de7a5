"""The classifier on held-out real logs (issue 37, item 6).

``tests/fixtures/failure-logs-holdout`` holds real excerpts collected in batches, each
only after the rules of the time were committed, and scored once then: those first-pass
figures, the honest estimate for unseen logs, are recorded in that folder's README and
in ``docs/guides/failure-classes.md``. A batch's misses then became rules, so this test
guards the folder as a regression set and reports where the rules stand on it:

    .venv/bin/python -m pytest tests/unit/test_classifier_holdout.py -s
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from tests.classifier_accuracy import evaluate, load_samples

HOLDOUT = Path(__file__).resolve().parents[1] / "fixtures" / "failure-logs-holdout"
MINIMUM = 0.95


def test_accuracy_on_the_held_out_logs() -> None:
    samples = load_samples(HOLDOUT)
    report = evaluate(HOLDOUT.name, samples)
    batch_of = {s.file: s.meta.get("batch") for s in samples}
    family_of = {s.file: s.meta.get("family") for s in samples}
    by_batch: dict[object, list[bool]] = defaultdict(list)
    by_family: dict[object, list[bool]] = defaultdict(list)
    for file, true, predicted in report.pairs:
        by_batch[batch_of[file]].append(true == predicted)
        by_family[family_of[file]].append(true == predicted)
    lines = [f"held-out logs: {report.correct}/{report.total} = {report.accuracy:.3f}"]
    lines += [f"  batch {b}: {sum(h)}/{len(h)}" for b, h in sorted(by_batch.items(), key=str)]
    lines += [f"  {f}: {sum(h)}/{len(h)}" for f, h in sorted(by_family.items(), key=str)]
    lines += [f"  miss {f}: true={t} predicted={p}" for f, t, p in report.mistakes()]
    print("\n".join(lines))
    assert len(samples) >= 50, "the held-out folder lost logs"
    assert report.accuracy >= MINIMUM, "\n".join(lines)
