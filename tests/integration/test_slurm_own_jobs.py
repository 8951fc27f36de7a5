"""Whose Slurm jobs a resubmission and a grow take for their own (issue 26).

A fake Slurm on PATH (``squeue``, ``scancel``, ``sbatch``, ``salloc``, ``scontrol``)
answers from one JSON file of jobs, each with its user, and logs every command. As a
real ``squeue``, it lists every user's jobs unless told ``-u``/``--me``. The audit's
repro: user bob runs ``lazarus-train-i4`` (job 777) and has ``lazarus-train-g4``
(job 778) pending; this user's job "train" (allocation 500) is preempted at its
incident 4, then grows at generation 4.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.nodes.allocation import cancel_submitted, submit
from activities.nodes.slurm.commands import SlurmCommandFailed
from activities.nodes.slurm.grow import grow
from activities.nodes.slurm.submit import (
    SubmitCancelled,
    SubmitRefused,
    extra_args_problems,
    resubmit,
    slurm_user,
    submit_problems,
)
from activities.slurm_allocation import submit_allocation
from lazarus.domain.contracts import (
    GrowAllocationRequest,
    SubmitAllocationRequest,
    run_tag,
    slurm_job_name,
)
from lazarus.domain.spec import SlurmSpec, parse_spec

pytestmark = pytest.mark.timeout(60)

RUN_KEY = "run-5b1f3c3e-9d1a-4c55-9a43-2f1d0a6c7e10"
RUN_DIR = "runs"
"""Relative: the fixture runs each test in its own temporary directory."""

FAKE = r"""
import json, os, re, sys

def expand(nodelist):
    match = re.fullmatch(r"(.*)\[(\d+)-(\d+)\]", nodelist)
    if not match:
        return nodelist.split(",")
    base, lo, hi = match.group(1), int(match.group(2)), int(match.group(3))
    return [f"{base}{i}" for i in range(lo, hi + 1)]

def option(args, *names):
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                return args[i + 1]
            if name.startswith("--") and arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None

state_file = os.environ["FAKE_SLURM_STATE"]
command, args = os.path.basename(sys.argv[0]), sys.argv[1:]
with open(state_file) as handle:
    state = json.load(handle)
state["log"].append(" ".join([command, *args]))
if command == "squeue" and state.get("squeue_fails", 0) > 0:  # slurmctld busy or away
    state["squeue_fails"] -= 1
    with open(state_file, "w") as handle:
        json.dump(state, handle)
    sys.stderr.write("squeue: error: slurm_load_jobs error: Socket timed out on send/recv\n")
    sys.exit(1)
jobs = state["jobs"]
me = state["me"]
out = ""
err = ""
if command == "squeue":
    job = option(args, "-j")
    user = me if "--me" in args else option(args, "-u", "--user")
    name = option(args, "--name", "-n")
    for job_id, found in sorted(jobs.items()):
        if job is not None and job_id != job:
            continue
        if user is not None and found["user"] != user:
            continue
        if name is not None and found["name"] != name:
            continue
        if "%T|%N" in args:
            out += f"{found['state']}|{found['nodelist']}\n"
        elif "%T" in args:
            out += f"{found['state']}\n"
        else:
            out += f"{job_id}\n"
elif command == "scontrol":
    if args[:2] == ["show", "hostnames"]:
        out = "\n".join(expand(args[2])) + "\n"
    elif args[0] == "update" and "NumNodes=0" in args:  # job expansion: hand the nodes over
        extra = jobs[args[1].split("=", 1)[1]]
        into = jobs[extra["expand"]]
        into["nodelist"] = ",".join(expand(into["nodelist"]) + expand(extra["nodelist"]))
elif command == "scancel":
    found = jobs.get(args[-1])
    if found is not None:
        found["state"] = "CANCELLED"
elif command == "sbatch":
    job_id = str(state["next_id"])
    state["next_id"] += 1
    jobs[job_id] = {
        "user": me,
        "name": option(args, "--job-name", "-J"),
        "state": "RUNNING",
        "nodelist": state["grant"],
    }
    out = f"{job_id}\n"
elif command == "salloc":
    job_id = str(state["next_id"])
    state["next_id"] += 1
    jobs[job_id] = {
        "user": me,
        "name": option(args, "--job-name", "-J"),
        "state": "RUNNING",
        "nodelist": state["grant"],
    }
    jobs[job_id]["expand"] = option(args, "--dependency").split(":", 1)[1]
    err = f"salloc: Granted job allocation {job_id}\n"
with open(state_file, "w") as handle:
    json.dump(state, handle)
sys.stdout.write(out)
sys.stderr.write(err)
"""


@dataclass
class FakeSlurm:
    state_file: Path

    def state(self) -> dict[str, object]:
        loaded: dict[str, object] = json.loads(self.state_file.read_text())
        return loaded

    def add(self, job_id: int, user: str, name: str, state: str, nodelist: str) -> None:
        data = self.state()
        jobs = data["jobs"]
        assert isinstance(jobs, dict)
        jobs[str(job_id)] = {"user": user, "name": name, "state": state, "nodelist": nodelist}
        self.state_file.write_text(json.dumps(data))

    def grant(self, nodelist: str) -> None:
        data = self.state()
        data["grant"] = nodelist
        self.state_file.write_text(json.dumps(data))

    def fail_squeue(self, times: int) -> None:
        """The next ``times`` ``squeue`` calls fail (exit 1), as under a busy slurmctld."""
        data = self.state()
        data["squeue_fails"] = times
        self.state_file.write_text(json.dumps(data))

    def log(self) -> list[str]:
        log = self.state()["log"]
        assert isinstance(log, list)
        return [str(line) for line in log]

    def job(self, job_id: int) -> dict[str, str]:
        jobs = self.state()["jobs"]
        assert isinstance(jobs, dict)
        found: dict[str, str] = jobs[str(job_id)]
        return found


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSlurm]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("squeue", "scancel", "sbatch", "salloc", "scontrol"):
        tool = bin_dir / name
        tool.write_text(f"#!{sys.executable}\n{FAKE}")
        tool.chmod(0o755)
    state_file = tmp_path / "slurm.json"
    fake = FakeSlurm(state_file)
    state_file.write_text(
        json.dumps(
            {"me": slurm_user(), "jobs": {}, "log": [], "next_id": 900, "grant": "alicen[3-4]"}
        )
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FAKE_SLURM_STATE", str(state_file))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setattr("activities.nodes.slurm.submit.WAIT_POLL_S", 0.01)
    yield fake


def bob_runs_his_train(fake: FakeSlurm) -> None:
    """Another user's jobs with the names an older Lazarus gave this job's."""
    fake.add(777, "bob", "lazarus-train-i4", "RUNNING", "bobn[1-2]")
    fake.add(778, "bob", "lazarus-train-g4", "PENDING", "")


def resubmit_request(
    run_key: str | None, nodes: int = 2, spares: int = 0
) -> SubmitAllocationRequest:
    mine = SlurmSpec(job_id=500, nodes=nodes, spares=spares, submitted=True, resubmit=True)
    return SubmitAllocationRequest(
        job_name="train", run_dir=RUN_DIR, slurm=mine, token="i4", run_key=run_key
    )


def test_run_names_are_unique_per_run_and_slurm_safe() -> None:
    other = "run-0d6c4b8e-1f2a-4c3b-8d9e-aa11bb22cc33"
    assert slurm_job_name("train", RUN_KEY, "i4") != slurm_job_name("train", other, "i4")
    tag = run_tag(RUN_KEY)
    assert tag is not None and len(tag) == 10 and tag.isalnum()
    assert slurm_job_name("train", RUN_KEY, "i4") == f"lazarus-train-{tag}-i4"
    assert slurm_job_name("train", None, "i4") == "lazarus-train-i4"  # older requests


@pytest.mark.parametrize("run_key", [RUN_KEY, None])
def test_resubmit_never_adopts_another_users_job_of_the_same_name(
    fake_slurm: FakeSlurm, run_key: str | None
) -> None:
    bob_runs_his_train(fake_slurm)
    lines: list[str] = []
    granted = resubmit(resubmit_request(run_key), lines.append)
    assert granted.job_id != 777 and granted.nodes == ["alicen3", "alicen4"]
    assert not any("adopted" in line for line in lines)
    lookups = [line for line in fake_slurm.log() if line.startswith("squeue -h")]
    assert lookups and all(f"-u {slurm_user()}" in line for line in lookups)
    assert fake_slurm.job(777)["state"] == "RUNNING"


def test_resubmit_adopts_this_runs_own_earlier_holder(fake_slurm: FakeSlurm) -> None:
    bob_runs_his_train(fake_slurm)
    name = slurm_job_name("train", RUN_KEY, "i4")
    fake_slurm.add(901, "bob", name, "RUNNING", "bobn[5-6]")  # same name, not ours
    fake_slurm.add(902, slurm_user(), name, "RUNNING", "alicen[7-8]")
    lines: list[str] = []
    granted = resubmit(resubmit_request(RUN_KEY), lines.append)
    assert granted.job_id == 902 and granted.nodes == ["alicen7", "alicen8"]
    assert not any(line.startswith("sbatch") for line in fake_slurm.log())


def test_a_failed_squeue_fails_a_retried_resubmit_and_never_submits_a_second_holder(
    fake_slurm: FakeSlurm,
) -> None:
    """Issue 37, N11: the first attempt submitted holder 902 and died; its retry asks
    ``squeue`` for it, and ``squeue`` fails. That used to read as "none found": a
    second holder was submitted, and 902 held its nodes, unrecorded, until its time
    limit. Now the attempt fails (retryable) and the next one adopts 902."""
    name = slurm_job_name("train", RUN_KEY, "i4")
    fake_slurm.add(902, slurm_user(), name, "PENDING", "")
    fake_slurm.fail_squeue(1)
    with pytest.raises(SlurmCommandFailed, match="Socket timed out"):
        resubmit(resubmit_request(RUN_KEY), lambda _: None)
    assert not any(line.startswith("sbatch") for line in fake_slurm.log())
    fake_slurm.job(902)  # still there, still its own
    fake_slurm.add(902, slurm_user(), name, "RUNNING", "alicen[7-8]")
    granted = resubmit(resubmit_request(RUN_KEY), lambda _: None)
    assert granted.job_id == 902
    assert not any(line.startswith("sbatch") for line in fake_slurm.log())


async def test_the_activity_retries_a_failed_squeue(fake_slurm: FakeSlurm) -> None:
    """Not a refusal: a retry may find squeue answering (QUICK_RETRY)."""
    fake_slurm.fail_squeue(1)
    with pytest.raises(Exception) as caught:
        await ActivityEnvironment().run(submit_allocation, resubmit_request(RUN_KEY))
    assert not (isinstance(caught.value, ApplicationError) and caught.value.non_retryable)
    assert not any(line.startswith("sbatch") for line in fake_slurm.log())


def test_giving_back_says_nothing_was_submitted_only_when_squeue_says_so(
    fake_slurm: FakeSlurm,
) -> None:
    name = slurm_job_name("train", RUN_KEY, "i4")
    fake_slurm.add(902, slurm_user(), name, "PENDING", "")
    fake_slurm.fail_squeue(1)
    with pytest.raises(SlurmCommandFailed):
        cancel_submitted(resubmit_request(RUN_KEY))
    assert cancel_submitted(resubmit_request(RUN_KEY)) == [902]


def test_resubmit_never_adopts_the_allocation_it_releases(fake_slurm: FakeSlurm) -> None:
    """The workflow names the allocation it recorded; even a same-named one still
    listed as RUNNING (scancel takes a moment) is not the new allocation."""
    name = slurm_job_name("train", RUN_KEY, "i4")
    fake_slurm.add(500, slurm_user(), name, "RUNNING", "alicen[1-2]")
    request = resubmit_request(RUN_KEY).model_copy(update={"release_old": False})
    granted = resubmit(request, lambda _: None)
    assert granted.job_id != 500


def test_an_adopted_allocation_of_the_wrong_size_is_refused_and_cancelled(
    fake_slurm: FakeSlurm,
) -> None:
    name = slurm_job_name("train", RUN_KEY, "i4")
    fake_slurm.add(902, slurm_user(), name, "RUNNING", "alicen[7-8]")
    with pytest.raises(SubmitRefused, match=r"holds 2 node.*but 3 were asked for"):
        resubmit(resubmit_request(RUN_KEY, nodes=2, spares=1), lambda _: None)
    assert fake_slurm.job(902)["state"] == "CANCELLED"


async def test_the_activity_refuses_a_wrong_size_for_good(fake_slurm: FakeSlurm) -> None:
    """Non-retryable: asking again at once gets the same allocation."""
    fake_slurm.grant("alicen[3-4]")
    with pytest.raises(ApplicationError) as caught:
        await ActivityEnvironment().run(submit_allocation, resubmit_request(RUN_KEY, nodes=3))
    assert caught.value.non_retryable and "but 3 were asked for" in str(caught.value)


def grow_request(run_key: str | None) -> GrowAllocationRequest:
    return GrowAllocationRequest(
        job_name="train",
        slurm=SlurmSpec(job_id=500, grow=True),
        known_nodes=["alicen1", "alicen2"],
        exclude=["alicen2"],
        token="g4",
        run_key=run_key,
        known_job_ids=[500],
    )


@pytest.mark.parametrize("run_key", [RUN_KEY, None])
def test_grow_never_cancels_another_users_request(
    fake_slurm: FakeSlurm, run_key: str | None
) -> None:
    bob_runs_his_train(fake_slurm)
    fake_slurm.add(500, slurm_user(), "lazarus-train", "RUNNING", "alicen[1-2]")
    fake_slurm.grant("alicen3")
    granted = grow(grow_request(run_key), lambda _: None)
    assert granted.job_id == 500 and granted.nodes == ["alicen3"]
    assert "scancel 778" not in fake_slurm.log()
    assert fake_slurm.job(778)["state"] == "PENDING"


def test_grow_cancels_only_its_own_leftover_and_never_its_allocation(
    fake_slurm: FakeSlurm,
) -> None:
    name = slurm_job_name("train", RUN_KEY, "g4")
    fake_slurm.add(500, slurm_user(), name, "RUNNING", "alicen[1-2]")  # the allocation itself
    fake_slurm.add(880, slurm_user(), name, "PENDING", "")  # an earlier attempt's request
    fake_slurm.add(881, "bob", name, "PENDING", "")
    granted = grow(grow_request(RUN_KEY), lambda _: None)
    assert granted.nodes == ["alicen3"]
    log = fake_slurm.log()
    assert "scancel 880" in log
    assert "scancel 500" not in log and "scancel 881" not in log


@pytest.mark.parametrize(
    ("arg", "names"),
    [
        ("--export=ALL,PATH=/tmp/evil", "--export is not allowed"),
        ("--expo=ALL", "--export is not allowed"),  # sbatch takes a prefix
        ("--export-file=/tmp/env", "--export-file is not allowed"),
        ("--wrap=id", "--wrap is not allowed"),
        ("--job-name=other", "--job-name is not allowed"),
        ("-Jother", "-J (--job-name) is not allowed"),
        ("-o/tmp/x", "-o (--output) is not allowed"),
        ("evil.sh", "is not an option"),
        ("--", "is not an option"),
    ],
)
def test_extra_args_may_not_change_what_the_holder_runs(arg: str, names: str) -> None:
    (problem,) = extra_args_problems(["--qos=high", arg])
    assert problem.startswith("slurm.extra_args") and names in problem


def test_ordinary_scheduling_options_pass() -> None:
    assert extra_args_problems(["--qos=high", "--exclusive", "-Cgpu", "--gres=gpu:8"]) == []


def test_a_refused_extra_arg_submits_nothing(fake_slurm: FakeSlurm) -> None:
    spec = parse_spec(
        {
            "name": "train",
            "command": ["python", "t.py"],
            "slurm": {"nodes": 1, "extra_args": ["--export=ALL,LD_PRELOAD=/tmp/x.so"]},
        },
        "job.yaml",
    )
    (problem,) = submit_problems(spec)
    assert "--export is not allowed" in problem
    request = resubmit_request(RUN_KEY).model_copy(
        update={
            "slurm": SlurmSpec(
                job_id=500, nodes=2, submitted=True, resubmit=True, extra_args=["--wrap=id"]
            )
        }
    )
    with pytest.raises(SubmitRefused, match="--wrap is not allowed"):
        resubmit(request, lambda _: None)
    assert not any(line.startswith("sbatch") for line in fake_slurm.log())


# --- the first submit, now the workflow's first step (issue 27) ----------------------


def first_request(run_key: str = RUN_KEY) -> SubmitAllocationRequest:
    """What the workflow asks for a submit-mode job's first allocation."""
    return SubmitAllocationRequest(
        job_name="train",
        run_dir=RUN_DIR,
        slurm=SlurmSpec(nodes=2, partition="gpu"),
        token="start",
        release_old=False,
        run_key=run_key,
    )


def test_a_first_submit_submits_a_holder_under_this_runs_own_name(fake_slurm: FakeSlurm) -> None:
    bob_runs_his_train(fake_slurm)
    lines: list[str] = []
    granted = submit(first_request(), lines.append)
    assert granted.job_id == 900 and granted.nodes == ["alicen3", "alicen4"]
    (sbatch,) = [line for line in fake_slurm.log() if line.startswith("sbatch")]
    assert f"--job-name={slurm_job_name('train', RUN_KEY, 'start')}" in sbatch
    assert not any(line.startswith("scancel") for line in fake_slurm.log())  # nothing to release


def test_a_retried_first_submit_adopts_what_the_first_attempt_submitted(
    fake_slurm: FakeSlurm,
) -> None:
    fake_slurm.add(902, slurm_user(), slurm_job_name("train", RUN_KEY, "start"), "RUNNING",
                   "alicen[7-8]")  # fmt: skip
    granted = submit(first_request(), lambda _: None)
    assert granted.job_id == 902
    assert not any(line.startswith("sbatch") for line in fake_slurm.log())


def test_a_first_submit_called_off_while_it_waits_cancels_its_holder(
    fake_slurm: FakeSlurm,
) -> None:
    """The activity cancelled (the job was cancelled while PENDING): the thread stops
    waiting and gives back what it submitted, instead of leaving it queued."""
    fake_slurm.add(902, slurm_user(), slurm_job_name("train", RUN_KEY, "start"), "PENDING", "")
    called_off = threading.Event()
    called_off.set()
    with pytest.raises(SubmitCancelled):
        submit(first_request(), lambda _: None, called_off)
    assert fake_slurm.job(902)["state"] == "CANCELLED"


def test_giving_back_a_first_submit_cancels_only_this_users_holder(
    fake_slurm: FakeSlurm,
) -> None:
    name = slurm_job_name("train", RUN_KEY, "start")
    fake_slurm.add(901, "bob", name, "PENDING", "")
    fake_slurm.add(902, slurm_user(), name, "PENDING", "")
    assert cancel_submitted(first_request()) == [902]
    assert fake_slurm.job(902)["state"] == "CANCELLED"
    assert fake_slurm.job(901)["state"] == "PENDING"
    assert cancel_submitted(first_request()) == []  # nothing left: nothing to do
