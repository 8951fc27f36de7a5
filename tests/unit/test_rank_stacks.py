"""A hang's evidence carries the ranks' Python stacks (issue 38): py-spy's dump folded
into one bounded line per rank; no py-spy, no stacks, and the recovery goes on. The
real dump of a stopped rank is checked in
tests/integration/test_hang_budget_processes.py."""

from __future__ import annotations

import subprocess

import pytest

from lazarus.rank import rank_stacks
from lazarus.rank.rank_stacks import MAX_LINE_CHARS, StackTarget, dump_stack, fold, stack_lines

DUMP = """Process 6455: python train.py
Python v3.11.7 (/root/.pyenv/versions/3.11.7/bin/python3.11)

Thread 6455 (idle): "MainThread"
    wait (torch/distributed_c10d.py:2501)
    all_reduce (/opt/venv/lib/torch/distributed/distributed_c10d.py:2490)
    train_step (/home/me/job/train.py:40)
    <module> (/home/me/job/train.py:90)
Thread 6460 (idle): "snapshot-writer"
    wait (threading.py:320)
"""


def test_a_dump_folds_into_one_line_innermost_first() -> None:
    assert fold(DUMP) == (
        "[MainThread, idle] wait (torch/distributed_c10d.py:2501) < all_reduce "
        "(distributed/distributed_c10d.py:2490) < train_step (job/train.py:40) < <module> "
        "(job/train.py:90) | [snapshot-writer, idle] wait (threading.py:320)"
    )


def test_without_py_spy_one_line_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rank_stacks, "py_spy", lambda: None)
    assert stack_lines([StackTarget(1, 123)]) == [
        "rank stacks: py-spy is not installed on the worker (pip install py-spy)"
    ]
    assert stack_lines([]) == []


def test_a_failed_dump_says_why_and_a_long_one_is_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: object, **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess([], 1, "", "Error: Permission denied (os error 13)\n")

    monkeypatch.setattr(subprocess, "run", refused)
    assert dump_stack("py-spy", StackTarget(1, 123, stopped=True)) == (
        "rank 1 (pid 123, stopped) stack, innermost first: "
        "(py-spy could not read it: Error: Permission denied (os error 13))"
    )
    many = "Thread 1 (active)\n" + "".join(f"    f{i} (a/b.py:{i})\n" for i in range(500))

    def long(*args: object, **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess([], 0, many, "")

    monkeypatch.setattr(subprocess, "run", long)
    assert len(dump_stack("py-spy", StackTarget(0, 9))) == MAX_LINE_CHARS
