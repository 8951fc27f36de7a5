"""The rank helper's half of rejoin in place (issue 16), without torch.

What the controller relies on: every heartbeat says which generation the rank acts
for; under ``run_resilient`` a rejoin request naming the rank raises
:class:`lazarus.rank.RejoinRequested` from ``heartbeat`` (at the cost of a ``stat``
every 0.2 s at most) and ``should_checkpoint``; a malformed request is reported once
and ignored, never fatal; a waiting rank says so in its current heartbeat file, gives
up after its timeout, and on a request acts for the new generation with only the
rejoin phases in its timeline.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import lazarus.rank as lazarus_rank
from lazarus.domain import environment, phases
from lazarus.rank import rejoin as rank_rejoin
from lazarus.rank import rejoin_requests, reset

pytestmark = pytest.mark.timeout(60)

_CONTRACT_VARIABLES = [
    value for name, value in vars(environment).items() if name.isupper() and isinstance(value, str)
]


@pytest.fixture(autouse=True)
def rank_of_generation_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Rank 0 of generation 1 under Lazarus, with fresh module state and an
    environment restored afterwards (a rejoin writes ``os.environ`` itself)."""
    saved = dict(os.environ)
    for variable in _CONTRACT_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    gen = tmp_path / "gen-00001"
    gen.mkdir()
    monkeypatch.setenv(environment.JOB_ID, "job")
    monkeypatch.setenv(environment.RANK, "0")
    monkeypatch.setenv(environment.WORLD_SIZE, "2")
    monkeypatch.setenv(environment.GENERATION, "1")
    monkeypatch.setenv(environment.HEARTBEAT_FILE, str(gen / "heartbeat-0.json"))
    monkeypatch.setenv(environment.CONTROL_FILE, str(gen / "control.json"))
    monkeypatch.setenv(environment.HEARTBEAT_INTERVAL, "3600")
    _write_control(gen / "control.json", {"checkpoint_request": 0})
    reset._reset_state()
    yield gen
    reset._reset_state()
    os.environ.clear()
    os.environ.update(saved)


def _write_control(path: Path, document: dict[str, Any]) -> None:
    temp = path.with_name(path.name + ".writing")
    temp.write_text(json.dumps(document))
    os.replace(temp, path)


def _read(path: Path) -> dict[str, Any]:
    document = json.loads(path.read_text())
    assert isinstance(document, dict)
    return document


def _new_generation_env(root: Path, generation: int = 2) -> dict[str, str | None]:
    gen = root / f"gen-{generation:05d}"
    gen.mkdir(exist_ok=True)
    _write_control(gen / "control.json", {"checkpoint_request": 0})
    env: dict[str, str | None] = dict.fromkeys(environment.REJOIN_VARIABLES)
    env.update(
        {
            environment.RANK: "0",
            environment.WORLD_SIZE: "2",
            environment.MASTER_ADDR: "127.0.0.1",
            environment.MASTER_PORT: "29600",
            environment.RESTART_COUNT: str(generation - 1),
            environment.GENERATION: str(generation),
            environment.HEARTBEAT_FILE: str(gen / "heartbeat-0.json"),
            environment.CONTROL_FILE: str(gen / "control.json"),
            environment.RUN_DIR: str(gen),
            environment.RESUME_FROM: str(root / "ckpt" / "step-00000020"),
            environment.RESUME_STEP: "20",
            environment.CHECKPOINT_EVERY_STEPS: "5",
        }
    )
    return env


def _ask_to_rejoin(gen: Path, env: dict[str, str | None], generation: int = 2) -> None:
    document = _read(gen / "control.json")
    document[environment.CONTROL_REJOIN] = {"generation": generation, "env": {"0": env}}
    _write_control(gen / "control.json", document)


# --------------------------------------------------------------------------- heartbeat


def test_every_heartbeat_says_which_generation_the_rank_acts_for(
    rank_of_generation_one: Path,
) -> None:
    lazarus_rank.heartbeat(3)
    document = _read(rank_of_generation_one / "heartbeat-0.json")
    assert document[environment.HEARTBEAT_GENERATION] == 1
    assert environment.HEARTBEAT_REJOIN not in document


def test_heartbeat_raises_when_the_controller_asks_this_rank_to_rejoin(
    rank_of_generation_one: Path,
) -> None:
    gen = rank_of_generation_one
    rank_rejoin._arm_rejoin(True)
    lazarus_rank.heartbeat(1)
    _ask_to_rejoin(gen, _new_generation_env(gen.parent))
    deadline = time.monotonic() + 10
    with pytest.raises(lazarus_rank.RejoinRequested) as raised:
        while time.monotonic() < deadline:
            lazarus_rank.heartbeat(2)
            time.sleep(0.01)
    assert raised.value.generation == 2
    assert "rank 0" in str(raised.value) and "generation 2" in str(raised.value)
    with pytest.raises(lazarus_rank.RejoinRequested):
        lazarus_rank.should_checkpoint(2, every=10)


def test_a_script_outside_run_resilient_never_sees_the_request(
    rank_of_generation_one: Path,
) -> None:
    gen = rank_of_generation_one
    _ask_to_rejoin(gen, _new_generation_env(gen.parent))
    lazarus_rank.heartbeat(1)
    time.sleep(0.25)
    lazarus_rank.heartbeat(2)
    assert lazarus_rank.should_checkpoint(2, every=10) is False


@pytest.mark.parametrize(
    "rejoin",
    [
        pytest.param({"generation": 1, "env": {"0": {}}}, id="own-generation"),
        pytest.param({"generation": 2, "env": {"1": {}}}, id="another-rank"),
    ],
)
def test_requests_for_others_are_ignored_quietly(
    rank_of_generation_one: Path, rejoin: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    gen = rank_of_generation_one
    _write_control(
        gen / "control.json", {"checkpoint_request": 0, environment.CONTROL_REJOIN: rejoin}
    )
    rank_rejoin._arm_rejoin(True)
    lazarus_rank.heartbeat(1)
    assert lazarus_rank.should_checkpoint(1, every=10) is False
    assert capsys.readouterr().err == ""


def test_the_control_file_is_stated_at_most_every_poll_interval(
    rank_of_generation_one: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """heartbeat() is called every step: looking for a request must stay rare."""
    control = str(rank_of_generation_one / "control.json")
    real_stat = os.stat
    stats = 0

    def counting_stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        nonlocal stats
        if str(path) == control:
            stats += 1
        return real_stat(path, *args, **kwargs)

    rank_rejoin._arm_rejoin(True)
    monkeypatch.setattr(os, "stat", counting_stat)
    started = time.monotonic()
    for step in range(20_000):
        lazarus_rank.heartbeat(step)
    elapsed = time.monotonic() - started
    monkeypatch.undo()
    assert 1 <= stats <= 2 + elapsed / rejoin_requests.REJOIN_POLL_INTERVAL_S


# --------------------------------------------------------------------------- malformed requests

_MALFORMED = [
    pytest.param("soon", id="not-an-object"),
    pytest.param({"generation": "2", "env": {}}, id="generation-a-string"),
    pytest.param({"generation": True, "env": {}}, id="generation-a-bool"),
    pytest.param({"generation": 2, "env": ["0"]}, id="env-a-list"),
    pytest.param({"generation": 2, "env": {"0": "MASTER_PORT=1"}}, id="entry-a-string"),
    pytest.param({"generation": 2, "env": {"0": {"PATH": "/bin"}}}, id="not-a-rejoin-variable"),
    pytest.param({"generation": 2, "env": {"0": {"MASTER_PORT": 29600}}}, id="value-a-number"),
    pytest.param({"generation": 2, "env": {"0": {"RANK": "zero"}}}, id="rank-not-an-integer"),
    pytest.param(
        {"generation": 2, "env": {"0": {"LAZARUS_GENERATION": "3"}}}, id="generation-mismatch"
    ),
]


@pytest.mark.parametrize("rejoin", _MALFORMED)
def test_a_malformed_request_is_reported_once_and_ignored(
    rank_of_generation_one: Path,
    rejoin: object,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gen = rank_of_generation_one
    # Each rewrite is waited past one poll interval; a short one keeps 9 cases fast.
    monkeypatch.setattr(rejoin_requests, "REJOIN_POLL_INTERVAL_S", 0.02)
    rank_rejoin._arm_rejoin(True)
    for request in (1, 2, 3):  # rewritten three times: the rest of the file still works
        _write_control(
            gen / "control.json",
            {"checkpoint_request": request, environment.CONTROL_REJOIN: rejoin},
        )
        time.sleep(rejoin_requests.REJOIN_POLL_INTERVAL_S + 0.05)
        lazarus_rank.heartbeat(request)
        assert lazarus_rank.should_checkpoint(request) is True
    err = capsys.readouterr().err
    assert err.count("rejoin request ignored") == 1, err
    assert rank_rejoin._await_rejoin(0.2) is None


# --------------------------------------------------------------------------- waiting and rejoining


def test_a_rank_without_a_request_waits_visibly_then_gives_up(
    rank_of_generation_one: Path,
) -> None:
    beat = rank_of_generation_one / "heartbeat-0.json"
    rank_rejoin._arm_rejoin(True)
    lazarus_rank.heartbeat(17, loss=0.5)
    rank_rejoin._mark_torn_down()
    started = time.monotonic()
    assert rank_rejoin._await_rejoin(0.5) is None
    assert 0.5 <= time.monotonic() - started < 30
    document = _read(beat)
    assert document[environment.HEARTBEAT_REJOIN] == "waiting"
    assert document["step"] == 17
    assert document[environment.HEARTBEAT_GENERATION] == 1
    assert phases.TORN_DOWN in document[phases.HEARTBEAT_FIELD]


def test_a_rejoin_applies_the_new_generation_and_starts_its_timeline_afresh(
    rank_of_generation_one: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gen = rank_of_generation_one
    monkeypatch.setenv(environment.MEMORY_CHECKPOINT_DIR, "/dev/shm/lazarus/job/old")
    env = _new_generation_env(gen.parent)
    rank_rejoin._arm_rejoin(True)
    lazarus_rank.mark(phases.PROCESS_GROUP_READY)
    lazarus_rank.heartbeat(23)
    rank_rejoin._mark_torn_down()
    _ask_to_rejoin(gen, env)
    request = rank_rejoin._await_rejoin(10)
    assert request is not None and request.generation == 2
    rank_rejoin._enter_generation(request)

    for name, value in env.items():
        assert os.environ.get(name) == value, name  # set, or unset (null)
    assert lazarus_rank.info().generation == 2
    new_beat = _read(gen.parent / "gen-00002" / "heartbeat-0.json")
    assert new_beat[environment.HEARTBEAT_GENERATION] == 2
    assert new_beat["step"] == 20  # the new resume step: nothing done in generation 2 yet
    assert set(new_beat[phases.HEARTBEAT_FIELD]) == {phases.TORN_DOWN, phases.REJOIN_RECEIVED}
    # The old generation's file keeps its last word: waiting, at step 23.
    old_beat = _read(gen / "heartbeat-0.json")
    assert (old_beat["step"], old_beat[environment.HEARTBEAT_REJOIN]) == (23, "waiting")

    # The new generation's resume point, intervals and control file are in force.
    assert lazarus_rank.resume_point() == (20, Path(str(env[environment.RESUME_FROM])))
    assert lazarus_rank.checkpoint_every_steps() == 5
    lazarus_rank.heartbeat(20)
    assert phases.FIRST_STEP not in lazarus_rank.phase_marks()
    lazarus_rank.heartbeat(21)
    marks = lazarus_rank.phase_marks()
    assert phases.FIRST_STEP in marks
    assert phases.PROCESS_STARTED not in marks and phases.FRAMEWORK_IMPORTED not in marks
    assert marks[phases.TORN_DOWN] <= marks[phases.REJOIN_RECEIVED] <= marks[phases.FIRST_STEP]
    # The request that was acted on does not fire again in the new generation.
    lazarus_rank.heartbeat(22)
    time.sleep(rejoin_requests.REJOIN_POLL_INTERVAL_S + 0.05)
    lazarus_rank.heartbeat(23)


def test_a_second_rejoin_marks_its_own_teardown(rank_of_generation_one: Path) -> None:
    gen = rank_of_generation_one
    rank_rejoin._arm_rejoin(True)
    rank_rejoin._mark_torn_down()
    _ask_to_rejoin(gen, _new_generation_env(gen.parent, 2))
    request = rank_rejoin._await_rejoin(10)
    assert request is not None
    rank_rejoin._enter_generation(request)
    first = lazarus_rank.phase_marks()[phases.TORN_DOWN]

    time.sleep(0.01)
    rank_rejoin._mark_torn_down()
    second = lazarus_rank.phase_marks()[phases.TORN_DOWN]
    assert second > first
    gen2 = gen.parent / "gen-00002"
    env3 = _new_generation_env(gen.parent, 3)
    _ask_to_rejoin(gen2, env3, generation=3)
    request = rank_rejoin._await_rejoin(10)
    assert request is not None and request.generation == 3
    rank_rejoin._enter_generation(request)
    assert lazarus_rank.phase_marks()[phases.TORN_DOWN] == second
    assert lazarus_rank.info().generation == 3


def test_waiting_needs_run_resilient() -> None:
    with pytest.raises(RuntimeError, match="_arm_rejoin"):
        rank_rejoin._await_rejoin(0.1)


# --------------------------------------------------------------------------- torch glue

_GLOO_CLOSED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
    "by peer [127.0.0.1]:16815. This is typically caused by a remote worker crashing."
)


def _chained(cause: BaseException, error: BaseException) -> BaseException:
    try:
        raise error from cause
    except BaseException as raised:
        return raised


@pytest.mark.parametrize(
    ("error_text", "expected"),
    [
        pytest.param(_GLOO_CLOSED, True, id="gloo-peer-killed"),
        pytest.param(
            "Got the following error when running the callback: RuntimeError: [pair.cc:537] "
            "Read error [127.0.0.1]:26515: Connection reset by peer.",
            True,
            id="gloo-comm-hook-future",
        ),
        pytest.param(
            "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
            "Timed out waiting 5000ms for recv operation to complete",
            True,
            id="gloo-peer-frozen",
        ),
        pytest.param("NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited", True),
        pytest.param("CUDA out of memory. Tried to allocate 2.00 GiB", False, id="oom"),
        pytest.param("the operation timed out", False, id="a-vague-timeout"),
    ],
)
@pytest.mark.slow  # imports torch
def test_runtime_errors_that_mean_a_peer_failed(error_text: str, expected: bool) -> None:
    pytest.importorskip("torch")
    import lazarus.rank.torch as lazarus_torch

    assert lazarus_torch.is_peer_failure(RuntimeError(error_text)) is expected
    assert lazarus_torch.is_peer_failure(ValueError(error_text)) is False  # RuntimeError only


@pytest.mark.slow  # imports torch
def test_peer_failures_by_type_and_by_cause() -> None:
    pytest.importorskip("torch")
    import torch.distributed as dist

    import lazarus.rank.torch as lazarus_torch

    assert lazarus_torch.is_peer_failure(dist.DistBackendError("watchdog"))
    assert lazarus_torch.is_peer_failure(dist.DistStoreError("wait timeout"))
    assert lazarus_torch.is_peer_failure(lazarus_rank.RejoinRequested(0, 2))
    assert not lazarus_torch.is_peer_failure(FloatingPointError("loss is nan at step 4"))
    assert not lazarus_torch.is_peer_failure(KeyError("model"))
    cleanup_error = _chained(RuntimeError(_GLOO_CLOSED), ValueError("while saving"))
    assert lazarus_torch.is_peer_failure(cleanup_error)
    assert not lazarus_torch.is_peer_failure(_chained(KeyError("x"), ValueError("y")))


def test_the_watch_thread_reads_a_request_without_taking_it_from_the_main_thread(
    rank_of_generation_one: Path,
) -> None:
    """``rejoin_request_now`` (the NCCL watch's read) sees the request and leaves the
    helper's own state alone: the main thread still raises on its next heartbeat."""
    gen = rank_of_generation_one
    rank_rejoin._arm_rejoin(True)
    assert lazarus_rank.control.rejoin_request_now() is None
    _ask_to_rejoin(gen, _new_generation_env(gen.parent))
    request = lazarus_rank.control.rejoin_request_now()
    assert request is not None and request.generation == 2
    with pytest.raises(lazarus_rank.RejoinRequested):
        lazarus_rank.heartbeat(2)
    (gen / "control.json").write_text("{half-writ")
    assert lazarus_rank.control.rejoin_request_now() is None


@pytest.mark.slow  # imports torch
def test_under_rejoin_on_nccl_the_watchdog_aborts_and_raises_rather_than_ending_the_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The launcher sets ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` as torchrun does; a rank
    that must outlive its peer's failure needs 2. A job's own 0 or 2 is kept, and
    nothing changes on gloo or without rejoin."""
    pytest.importorskip("torch")
    from lazarus.rank import nccl_teardown

    variable = environment.NCCL_ASYNC_ERROR_HANDLING
    monkeypatch.setenv(variable, "1")
    nccl_teardown.prefer_nccl_cleanup_only("nccl")
    assert os.environ[variable] == "1"  # not armed: no rejoin, no change
    rank_rejoin._arm_rejoin(True)
    nccl_teardown.prefer_nccl_cleanup_only("gloo")
    assert os.environ[variable] == "1"
    nccl_teardown.prefer_nccl_cleanup_only("nccl")
    assert os.environ[variable] == "2"
    monkeypatch.setenv(variable, "0")
    nccl_teardown.prefer_nccl_cleanup_only("nccl")
    assert os.environ[variable] == "0"


@pytest.mark.slow  # imports torch
def test_once_the_watch_aborted_every_error_is_the_peers() -> None:
    pytest.importorskip("torch")
    import lazarus.rank.torch as lazarus_torch

    assert not lazarus_torch.is_peer_failure(
        ValueError("Default process group has not been initialized")
    )
    lazarus_torch._watch_aborted.set()
    try:
        assert lazarus_torch.is_peer_failure(
            ValueError("Default process group has not been initialized")
        )
    finally:
        lazarus_torch._watch_aborted.clear()


@pytest.mark.slow  # imports torch
def test_run_resilient_rejoins_when_asked_and_a_fresh_generation_restarts_from_setup(
    rank_of_generation_one: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """In one process, world size 1: the controller's request raises in heartbeat(),
    the helper tears the group down, rejoins generation 2 (which has no checkpoint to
    resume from) and calls train again with the state setup() built, not the one the
    first generation trained."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    import lazarus.rank.torch as lazarus_torch
    from lazarus.domain.ports import free_port

    gen = rank_of_generation_one
    monkeypatch.setenv(environment.WORLD_SIZE, "1")
    monkeypatch.setenv(environment.MASTER_ADDR, "127.0.0.1")
    monkeypatch.setenv(environment.MASTER_PORT, str(free_port()))
    monkeypatch.setenv(environment.REJOIN_TIMEOUT_S, "30")
    env2 = _new_generation_env(gen.parent)
    env2.update(
        {
            environment.WORLD_SIZE: "1",
            environment.MASTER_PORT: str(free_port()),
            environment.RESUME_FROM: None,
            environment.RESUME_STEP: None,
        }
    )
    calls: list[tuple[int, int, Any]] = []

    def setup() -> dict[str, Any]:
        torch.manual_seed(0)
        return {"model": torch.nn.Linear(2, 1)}

    def train(start_step: int, state: Any) -> None:
        weight = state["model"].weight
        calls.append((start_step, lazarus_rank.info().generation, weight.detach().clone()))
        if len(calls) > 1:
            return
        with torch.no_grad():
            weight.add_(1.0)
        _ask_to_rejoin(gen, env2)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            lazarus_rank.heartbeat(1)
            time.sleep(0.01)
        pytest.fail("heartbeat() never raised RejoinRequested")

    lazarus_torch.run_resilient(train, setup, backend="gloo", timeout=timedelta(seconds=30))

    assert [(start, generation) for start, generation, _ in calls] == [(0, 1), (0, 2)]
    assert torch.equal(calls[0][2], calls[1][2])
    assert not dist.is_initialized()
    err = capsys.readouterr().err
    assert "lazarus.rank: rank 0 leaves generation 1 (RejoinRequested: " in err
    assert "lazarus.rank: rank 0 rejoined generation 2 at step 0 (torn down in " in err
    beat = _read(gen.parent / "gen-00002" / "heartbeat-0.json")
    assert beat[environment.HEARTBEAT_GENERATION] == 2
    assert set(beat[phases.HEARTBEAT_FIELD]) == {
        phases.TORN_DOWN,
        phases.REJOIN_RECEIVED,
        phases.PROCESS_GROUP_READY,
        phases.CHECKPOINT_LOADED,
    }
