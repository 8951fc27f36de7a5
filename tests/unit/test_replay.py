"""Histories recorded from released controllers must replay on the current code.

``tests/fixtures/histories/released/<commit>/`` holds real end-to-end histories
(a crash, a hang, node loss, pause/resume, rollback, continue-as-new, ...) recorded
once from that released commit and **never re-recorded**: a week-long job started on
that release is replayed by every later worker, so any change that alters the
commands an old history issued fails here, in CI, instead of in production. A change
that must alter them goes behind ``workflow.patched`` (see ``workflows.job``), or
ships as a new Worker Deployment build (see ``workers.versioning``).

To add a release's corpus (once per release, from that release's checkout)::

    LAZARUS_RECORD_HISTORIES=tests/fixtures/histories/released/<commit> \\
        pytest tests/e2e -k "crash or hang or node or pause or rolls_back or continue_as_new"
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workflows.job import JobWorkflow

RELEASED = Path(__file__).resolve().parents[1] / "fixtures" / "histories" / "released"
HISTORIES = sorted(RELEASED.glob("*/*.json"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", HISTORIES, ids=[f"{p.parent.name}/{p.stem}" for p in HISTORIES])
async def test_released_history_replays_on_current_code(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(workflows=[JobWorkflow], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)


def test_the_corpus_covers_the_released_behaviours() -> None:
    names = " ".join(p.stem for p in HISTORIES)
    for behaviour in ("crash", "hang", "dead_node", "pause", "rolls_back", "continue_as_new"):
        assert behaviour in names, f"no released history exercises {behaviour}"
