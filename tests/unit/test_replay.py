"""Replaying stored histories catches non-determinism before it reaches running jobs.

The histories come from real end-to-end runs (a crash, a hang, a pause, a forced
recovery, continue-as-new). Refresh them after an intended workflow change with
``LAZARUS_RECORD_HISTORIES=tests/fixtures/histories pytest tests/e2e``; every e2e
test also replays its own fresh history.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workflows.job import JobWorkflow

HISTORIES = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "histories").glob("*.json"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_stored_history_replays(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(workflows=[JobWorkflow], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)


def test_there_are_histories_to_replay() -> None:
    assert len(HISTORIES) >= 3
