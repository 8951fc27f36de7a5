"""The verbs scripts drive, offline: ``wait`` (and ``start --wait``'s exit codes),
``logs``, ``--json`` on the steering verbs, and ``status --watch`` into a pipe.

A :class:`JobClient` whose ``status`` plays a script of views stands in for the
server (the real client's ``wait`` loop runs on it); tests/workflow/test_job_client.py
drives the same calls against a real dev server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner

from lazarus.app import cli, cli_logs, cli_wait, outcome
from lazarus.app.client import CancelResult, JobClient, JobNotFound, RequestRejected, StatusView
from lazarus.app.outcome import EXIT_CODES, Outcome, outcome_of
from lazarus.domain.contracts import RankStatus
from lazarus.domain.spec import JobSpec, parse_spec
from workflows.state import JobStatus, NodePool, Phase

pytestmark = pytest.mark.timeout(30)

REPO = Path(__file__).resolve().parents[2]


def _status(phase: Phase, step: int | None = 10, **fields: Any) -> JobStatus:
    data: dict[str, Any] = {
        "job_id": "demo",
        "phase": phase,
        "generation": 1,
        "step": step,
        "world_size": 2,
        "ranks": [],
        "restarts": 0,
        "max_restarts": 3,
        "incidents": [],
        "ettr": None,
        "elapsed_s": 1.0,
    }
    data.update(fields)
    return JobStatus(**data)


def _view(phase: Phase, execution: str = "RUNNING", **fields: Any) -> StatusView:
    return StatusView(
        workflow_id="lazarus-demo", execution_status=execution, status=_status(phase, **fields)
    )


class FakeJobs(JobClient):
    """``status`` answers from ``views`` (the last one repeats); steering calls are
    recorded; ``wait`` polls without sleeping."""

    views: ClassVar[list[StatusView]] = []
    spec_: ClassVar[JobSpec | None] = None
    calls: ClassVar[list[tuple[str, tuple[Any, ...]]]] = []
    refuse: ClassVar[str | None] = None

    def __init__(self, *_: Any, **__: Any) -> None:
        self.address = "fake"

    async def status(self, job: Any) -> StatusView:
        if not FakeJobs.views:
            raise JobNotFound(str(job))
        return FakeJobs.views.pop(0) if len(FakeJobs.views) > 1 else FakeJobs.views[0]

    async def list(self) -> list[Any]:  # the "did you mean" of a missing job
        return []

    async def wait(self, job: Any, **kwargs: Any) -> Any:
        return await super().wait(job, **{**kwargs, "poll_s": 0.0})

    async def spec(self, job: Any) -> JobSpec:
        assert FakeJobs.spec_ is not None
        return FakeJobs.spec_

    def _steer(self, name: str, *args: Any) -> None:
        if FakeJobs.refuse:
            raise RequestRejected(str(args[0]), FakeJobs.refuse)
        FakeJobs.calls.append((name, args))

    async def pause(self, job: Any) -> None:
        self._steer("pause", job)

    async def resume(self, job: Any) -> None:
        self._steer("resume", job)

    async def recover(self, job: Any, **kwargs: Any) -> str:
        self._steer("recover", job)
        return "recovery queued"

    async def drain(self, job: Any, node: str, reason: str = "") -> str:
        self._steer("drain", job, node)
        return f"draining {node}"

    async def return_node(self, job: Any, node: str) -> str:
        self._steer("return", job, node)
        return f"{node} returned to the spares"

    async def cancel(self, job: Any) -> CancelResult:
        self._steer("cancel", job)
        return CancelResult(job=str(job), already_closed_as="COMPLETED")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[FakeJobs]]:
    async def connected(settings: Any, timeout_s: float = 5.0) -> None:
        return None

    monkeypatch.setattr(cli, "connect", connected)
    monkeypatch.setattr(cli, "JobClient", FakeJobs)
    monkeypatch.setattr(cli_wait, "WATCH_INTERVAL_S", 0.0)
    FakeJobs.views, FakeJobs.calls, FakeJobs.refuse, FakeJobs.spec_ = [], [], None, None
    yield FakeJobs


def _run(*args: str) -> Any:
    return CliRunner().invoke(cli.app, list(args))


# --- wait ---------------------------------------------------------------------------------


def test_outcome_of_reads_the_phase_then_temporal() -> None:
    assert outcome_of("RUNNING", "RUNNING") is None
    assert outcome_of("RUNNING", "NEEDS_OPERATOR") == Outcome.NEEDS_OPERATOR
    assert outcome_of("RUNNING", "NEEDS_OPERATOR", stop_at_operator=False) is None
    assert outcome_of("RUNNING", "SUCCEEDED") == Outcome.SUCCEEDED  # before it closes
    assert outcome_of("COMPLETED", "FAILED") == Outcome.FAILED
    assert outcome_of("CANCELED", None) == Outcome.CANCELLED
    assert outcome_of("TERMINATED", "RUNNING") == Outcome.FAILED
    assert outcome_of("COMPLETED", None) == Outcome.FAILED  # never read success unsaid
    assert outcome_of("UNKNOWN", None) is None
    codes = list(EXIT_CODES.values())
    assert len(set(codes)) == len(codes) and EXIT_CODES[Outcome.SUCCEEDED] == 0
    assert not {1, 2} & set(codes)  # the CLI's own: no server, bad input


@pytest.mark.parametrize(
    ("final", "execution", "code"),
    [
        (Phase.SUCCEEDED, "COMPLETED", 0),
        (Phase.FAILED, "COMPLETED", 3),
        (Phase.CANCELLED, "CANCELED", 4),
        (Phase.NEEDS_OPERATOR, "RUNNING", 5),
    ],
)
def test_wait_exits_with_the_outcome(
    fake: type[FakeJobs], final: Phase, execution: str, code: int
) -> None:
    fake.views = [_view(Phase.RUNNING), _view(Phase.RECOVERING), _view(final, execution)]
    result = _run("wait", "demo")
    assert result.exit_code == code, result.output
    assert f"job 'demo' {final.value}" in result.stdout
    assert "phase=RECOVERING" in result.stderr  # a line per change, on stderr


def test_wait_json_and_through_operator(fake: type[FakeJobs]) -> None:
    fake.views = [
        _view(Phase.NEEDS_OPERATOR, operator_reason="no spare left"),
        _view(Phase.RUNNING),
        _view(Phase.SUCCEEDED, "COMPLETED", step=99),
    ]
    result = _run("wait", "demo", "--through-operator", "--json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["outcome"] == "SUCCEEDED" and body["exit_code"] == 0 and body["step"] == 99
    assert result.stderr == ""


def test_wait_timeout_and_no_such_job(fake: type[FakeJobs]) -> None:
    fake.views = [_view(Phase.RUNNING)]
    result = _run("wait", "demo", "--timeout", "0")
    assert result.exit_code == Outcome.TIMEOUT.exit_code, result.output
    assert "the job goes on" in result.stdout
    fake.views = []
    missing = _run("wait", "nope")
    assert missing.exit_code == Outcome.NO_SUCH_JOB.exit_code
    assert "no job named 'nope'" in missing.stderr
    assert _run("wait", "demo", "--timeout", "-1").exit_code == 2


def test_every_verb_that_names_a_missing_job_exits_no_such_job(fake: type[FakeJobs]) -> None:
    fake.views = []
    result = _run("status", "nope")
    assert result.exit_code == Outcome.NO_SUCH_JOB.exit_code, result.output
    assert "nope" in result.stderr


def test_wait_help_and_the_docs_give_the_table(fake: type[FakeJobs]) -> None:
    """One table (``outcome.EXIT_CODES``): the help is built from it, and the CLI page
    and the module's docstring must say the same codes."""
    assert outcome.__doc__ is not None
    page = (REPO / "docs" / "reference" / "cli.md").read_text()
    for state, code in EXIT_CODES.items():
        assert re.search(rf"^\| {code} \| `{state.value}` \|", page, re.MULTILINE), state
        assert re.search(rf"^{code}\s+{state.value}\s", outcome.__doc__, re.MULTILINE), state
    assert "5 NEEDS_OPERATOR" in " ".join(_run("wait", "--help").stdout.split())


def test_start_wait_options_need_wait(fake: type[FakeJobs], tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: tiny\ncommand: [python, train.py]\ncheckpoint_dir: ckpt\n")
    alone = _run("start", str(spec), "--timeout", "5")
    assert alone.exit_code == 2 and "go with --wait" in alone.stderr
    dry = _run("start", str(spec), "--wait", "--dry-run")
    assert dry.exit_code == 2 and "--dry-run" in dry.stderr


# --- --json on the steering verbs ---------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "action", "accepted"),
    [
        (["pause", "demo"], "pause", True),
        (["resume", "demo"], "resume", True),
        (["recover", "demo"], "recover", True),
        (["drain", "demo", "h2"], "drain", True),
        (["return", "demo", "h2"], "return", True),
        (["cancel", "demo"], "cancel", False),  # already closed: nothing sent
    ],
)
def test_steering_verbs_answer_json(
    fake: type[FakeJobs], args: list[str], action: str, accepted: bool
) -> None:
    result = _run(*args, "--json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["job"] == "demo" and body["action"] == action
    assert body["accepted"] is accepted and body["message"]
    assert [name for name, _ in fake.calls] == [action]


def test_a_refusal_under_json_stays_plain_text_on_stderr(fake: type[FakeJobs]) -> None:
    fake.refuse = "is PAUSED; pause applies only when it is RUNNING"
    result = _run("pause", "demo", "--json")
    assert result.exit_code == 1
    assert result.stdout == "" and "is PAUSED" in result.stderr


# --- status --watch off a terminal --------------------------------------------------------


def _watched() -> list[StatusView]:
    return [
        _view(Phase.RUNNING, step=1),
        _view(Phase.RUNNING, step=1, elapsed_s=2.0),  # only the clock moved: no line
        _view(Phase.RUNNING, step=2),
        _view(Phase.SUCCEEDED, "COMPLETED", step=3),
    ]


def test_watch_into_a_pipe_prints_a_line_per_change(fake: type[FakeJobs]) -> None:
    fake.views = _watched()
    result = _run("status", "demo", "--watch")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 3, lines
    assert "phase=RUNNING" in lines[0] and "step=1" in lines[0]
    assert "phase=SUCCEEDED" in lines[-1] and "workflow=COMPLETED" in lines[-1]


def test_watch_json_prints_json_lines(fake: type[FakeJobs]) -> None:
    fake.views = _watched()
    result = _run("status", "demo", "--watch", "--json")
    assert result.exit_code == 0, result.output
    docs = [json.loads(line) for line in result.stdout.splitlines()]
    assert [d["step"] for d in docs] == [1, 2, 3]
    assert docs[-1]["phase"] == "SUCCEEDED" and docs[-1]["workflow_status"] == "COMPLETED"


# --- logs ---------------------------------------------------------------------------------


def _logs_job(fake: type[FakeJobs], tmp_path: Path, nodes: list[dict[str, Any]]) -> Path:
    gen = tmp_path / "runs" / "demo" / "run-1" / "gen-00002"
    gen.mkdir(parents=True)
    fake.spec_ = parse_spec(
        {
            "name": "demo",
            "command": ["python", "train.py"],
            "checkpoint_dir": str(tmp_path / "ckpt"),
            "nodes": nodes,
        },
        "<test>",
    ).resolved(tmp_path)
    names = [n["name"] for n in nodes]
    ranks = [RankStatus(rank=i, node=name, pid=100 + i, alive=True) for i, name in enumerate(names)]
    fake.views = [
        _view(
            Phase.RUNNING,
            run_dir=str(gen.parent),
            generation=2,
            world_size=len(names),
            ranks=ranks,
            nodes=NodePool(active=names),
        )
    ]
    return gen


def test_logs_prints_local_rank_logs(fake: type[FakeJobs], tmp_path: Path) -> None:
    gen = _logs_job(fake, tmp_path, [{"name": "a"}, {"name": "b"}])
    (gen / "rank-0.log").write_text("zero 1\nzero 2\n")
    (gen / "rank-1.log").write_text("one 1\none 2\none 3\n")
    both = _run("logs", "demo")
    assert both.exit_code == 0, both.output
    assert both.stdout.splitlines() == [
        "[rank 0] zero 1",
        "[rank 0] zero 2",
        "[rank 1] one 1",
        "[rank 1] one 2",
        "[rank 1] one 3",
    ]
    one = _run("logs", "demo", "--rank", "1", "--tail", "1")
    assert one.exit_code == 0 and one.stdout == "one 3\n"
    bad = _run("logs", "demo", "--rank", "5")
    assert bad.exit_code == 2 and "ranks 0 to 1" in bad.stderr


def test_logs_says_which_log_is_missing(fake: type[FakeJobs], tmp_path: Path) -> None:
    gen = _logs_job(fake, tmp_path, [{"name": "a"}, {"name": "b"}])
    (gen / "rank-0.log").write_text("zero\n")
    result = _run("logs", "demo")
    assert result.exit_code == 1
    assert "[rank 0] zero" in result.stdout
    assert f"rank 1: no log at {gen / 'rank-1.log'}" in result.stderr


def test_logs_follow_prints_until_the_generation_ends(fake: type[FakeJobs], tmp_path: Path) -> None:
    gen = _logs_job(fake, tmp_path, [{"name": "a"}])
    (gen / "rank-0.log").write_text("first\nsecond\nno newline yet")
    (gen / "rank-0.exit.json").write_text("{}")  # ended: print what there is, and stop
    result = _run("logs", "demo", "-f", "--tail", "2")
    assert result.exit_code == 0, result.output
    assert result.stdout == "second\nno newline yet\n"


def test_follow_reads_lines_as_they_are_added(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gen = tmp_path / "gen-00001"
    gen.mkdir()
    log = cli_logs.RankLog(rank=0, node="local", path=gen / "rank-0.log", node_spec=None)
    got: list[list[bytes]] = []
    writes = iter(["a\nb", "c\n", None])

    def emit(_: cli_logs.RankLog, lines: list[tuple[bytes, float | None]]) -> None:
        if lines:
            got.append([line for line, _ in lines])

    def sleep_and_write(_: float) -> None:
        chunk = next(writes)
        if chunk is None:
            (gen / "stopped.json").write_text("{}")
        else:
            with open(log.path, "a") as handle:
                handle.write(chunk)

    monkeypatch.setattr(cli_logs.time, "sleep", sleep_and_write)
    cli_logs.follow([log], cli_logs.Reader(None), None, None, emit, poll_s=0)  # type: ignore[arg-type]
    assert got == [[b"a"], [b"bc"]]


def test_remote_logs_go_through_the_node_agent(
    fake: type[FakeJobs], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from activities import node_logs
    from activities.nodes.agent import LogChunk, NodeStatus, RankRecord

    asked: list[tuple[str, str, int]] = []
    text = b"remote 1\nremote 2\n"

    class Agent:
        def __init__(self, node: Any) -> None:
            self.node = node

        def log_read(self, gen_dir: str, rank: int, offset: int, max_bytes: int) -> LogChunk:
            asked.append((self.node.name, gen_dir, rank))
            return LogChunk(data=text[offset : offset + max_bytes], size=len(text), mtime=1.0)

        def poll(self, gen_dir: str, ranks: list[int]) -> NodeStatus:
            records = [RankRecord(rank=r, pid=1, alive=False) for r in ranks]
            return NodeStatus(node=self.node.name, reachable=True, ranks=records, observed_at=0)

        def close(self) -> None:
            pass

    monkeypatch.setattr(node_logs, "agent_for", lambda node, ssh, slurm=None: Agent(node))
    # The worker's reader, here in this process (through a worker: test_cli_client.py).
    monkeypatch.setattr(cli_logs, "WorkerLogs", lambda settings: node_logs.AgentLogs())
    gen = _logs_job(fake, tmp_path, [{"name": "h1", "launcher": "ssh", "host": "10.0.0.1"}])
    result = _run("logs", "demo", "--tail", "1")
    assert result.exit_code == 0, result.output
    assert result.stdout == "remote 2\n" and {a for a in asked} == {("h1", str(gen), 0)}
    follow = _run("logs", "demo", "-f")  # the rank has ended: all of it, then the end
    assert follow.exit_code == 0 and follow.stdout == "remote 1\nremote 2\n", follow.output
