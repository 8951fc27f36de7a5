"""Submit mode of the Slurm launcher (``slurm: {nodes: N, spares: S, ...}``): the
allocation a job asks Slurm for, first of all, and again after a preemption.

The first submit is the workflow's first step (``submit_allocation``, issue 27): the
job waits PENDING while Slurm queues the holder, then runs in the allocation it knows
(``slurm.job_id``, recorded in the job's runtime roster) and sees nodes by name, as in
the existing-allocation mode. A spec Slurm would refuse (a partition that does not
exist, an account the user lacks) is refused before the workflow starts, with nothing
submitted: ``sbatch --test-only`` with the same options (:func:`submit_problems`,
which ``lazarus start`` asks through the allocation facade).

The holder is :func:`~activities.nodes.slurm.preemption.holder_script`:
``--no-kill`` so a node failure does not end the allocation (Lazarus replaces the
node), ``--no-requeue`` so Slurm never restarts the holder behind the workflow's
back, ``--signal=B:USR1@<notice_s>`` for the just-in-time checkpoint.

Whose jobs (issue 26): a retried resubmission adopts the holder an earlier attempt
submitted, found by name. Names are not unique on a cluster (every user may run a
job called "train"), so the lookup only lists the worker's own user's jobs, the
name carries the workflow run's key (:func:`~lazarus.domain.contracts.slurm_job_name`),
and an adopted or new allocation must hold the node count the holder asked for.
``slurm.extra_args`` may not set what the holder's own options set, nor change what
it runs or its environment (:func:`extra_args_problems`).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import threading
import time
from collections.abc import Callable
from pathlib import Path

from activities.nodes.agent import AllocationRefused
from activities.nodes.slurm.commands import (
    RUNNING,
    Allocation,
    SlurmCommandFailed,
    allocation,
    one_line,
    run_slurm,
)
from activities.nodes.slurm.preemption import holder_script
from lazarus.domain.contracts import AllocationGranted, SubmitAllocationRequest
from lazarus.domain.spec import JobSpec, SlurmSpec

WAIT_POLL_S = 1.0
PROGRESS_EVERY_S = 10.0
ENDED = frozenset(
    {"CANCELLED", "COMPLETED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL"}
)
"""States of a job that will never run."""


class SubmitRefused(AllocationRefused):
    """Slurm refused the allocation, or it ended before it ran: one line naming the
    spec field where one is to blame."""


class SubmitCancelled(Exception):
    """The wait was called off (the activity was cancelled: the job was cancelled
    while it waited for its allocation)."""


RESERVED_OPTIONS = {
    "--job-name": "Lazarus names the holder, and finds it again by that name",
    "--wrap": "Lazarus gives the holder's script",
    "--export": "it sets the holder's environment (PATH, LD_PRELOAD): any program",
    "--export-file": "it sets the holder's environment (PATH, LD_PRELOAD): any program",
    "--get-user-env": "it sets the holder's environment from a login shell",
    "--container": "an OCI bundle would supply the holder's root filesystem, and its sh",
    "--container-id": "an OCI bundle would supply the holder's root filesystem, and its sh",
    "--chdir": "the holder runs where Lazarus starts it",
    "--output": "Lazarus gives the holder's log file",
    "--error": "Lazarus gives the holder's log file",
    "--input": "the holder reads nothing",
    "--nodes": "slurm.nodes and slurm.spares give the node count",
    "--parsable": "Lazarus sets it",
    "--no-kill": "Lazarus sets it",
    "--kill-on-invalid-dep": "Lazarus sets the holder's options",
    "--requeue": "the holder must never be requeued behind the workflow's back",
    "--no-requeue": "Lazarus sets it",
    "--signal": "slurm.notice_s gives it",
    "--array": "one holder, not an array",
    "--test-only": "Lazarus asks it itself",
    "--uid": "the holder runs as the worker's user",
    "--gid": "the holder runs as the worker's user",
}
"""Why some ``sbatch`` options are refused, for a clearer refusal than "not a
scheduling option": the holder's own options (which Lazarus's lookups rely on), and
those that choose which program the holder runs or its environment."""
RESERVED_SHORT = {
    "J": "--job-name",
    "o": "--output",
    "e": "--error",
    "i": "--input",
    "D": "--chdir",
    "N": "--nodes",
    "a": "--array",
}

VALUE, FLAG, OPTIONAL = "value", "flag", "optional"
SCHEDULING_OPTIONS: dict[str, str] = {
    # what to run on: constraints, features, generic resources
    "--partition": VALUE,  # as slurm.partition, which wins when both are given
    "--account": VALUE,  # as slurm.account
    "--qos": VALUE,
    "--constraint": VALUE,
    "--cluster-constraint": VALUE,
    "--prefer": VALUE,
    "--gres": VALUE,
    "--gres-flags": VALUE,
    "--gpus": VALUE,
    "--gpus-per-node": VALUE,
    "--gpus-per-task": VALUE,
    "--gpus-per-socket": VALUE,
    "--cpus-per-gpu": VALUE,
    "--mem-per-gpu": VALUE,
    "--gpu-bind": VALUE,
    "--licenses": VALUE,
    "--network": VALUE,
    "--switches": VALUE,
    "--reservation": VALUE,
    "--nodelist": VALUE,
    "--exclude": VALUE,
    # how much of each node
    "--exclusive": OPTIONAL,
    "--oversubscribe": FLAG,
    "--contiguous": FLAG,
    "--mem": VALUE,
    "--mem-per-cpu": VALUE,
    "--mincpus": VALUE,
    "--cpus-per-task": VALUE,
    "--ntasks": VALUE,
    "--ntasks-per-node": VALUE,
    "--ntasks-per-gpu": VALUE,
    "--sockets-per-node": VALUE,
    "--cores-per-socket": VALUE,
    "--threads-per-core": VALUE,
    "--extra-node-info": VALUE,
    "--hint": VALUE,
    "--tmp": VALUE,
    "--core-spec": VALUE,
    "--thread-spec": VALUE,
    # when, for how long, and at what priority
    "--time": VALUE,  # as slurm.time
    "--nice": OPTIONAL,
    "--priority": VALUE,
    "--begin": VALUE,
    "--deadline": VALUE,
    "--time-min": VALUE,
    "--dependency": VALUE,
    "--delay-boot": VALUE,
    # bookkeeping
    "--comment": VALUE,
    "--wckey": VALUE,
    "--mail-type": VALUE,
    "--mail-user": VALUE,
}
"""The ``sbatch`` options ``slurm.extra_args`` may give (issue 37, N9: an allow-list;
the deny-list before it missed ``--container``, an OCI bundle that supplies the
holder's ``sh``, a program no ``allowed_commands`` saw). Each only says where, when or
with how much the holder runs, never what it runs or with which environment. The kind
says how it is written: ``value`` options need ``=value``, ``flag`` options take none,
``optional`` ones either. Written in full: ``sbatch`` takes a prefix (``--qo``) too,
but an allow-list checks whole names."""
SCHEDULING_SHORT = {
    "p": "--partition",
    "A": "--account",
    "t": "--time",
    "C": "--constraint",
    "q": "--qos",
    "G": "--gpus",
    "c": "--cpus-per-task",
    "n": "--ntasks",
    "w": "--nodelist",
    "x": "--exclude",
    "d": "--dependency",
    "b": "--begin",
    "L": "--licenses",
    "B": "--extra-node-info",
}
"""Short forms allowed, each with its value glued on (``-Cgpu``)."""
NO_FILE_VALUES = frozenset({"--nodelist", "--exclude"})
"""Options ``sbatch`` reads a file for when the value holds a ``/``: names only."""


def extra_args_problems(extra_args: list[str]) -> list[str]:
    """Why ``slurm.extra_args`` cannot go on the holder's ``sbatch`` line, one line
    each naming the argument; empty when it can.

    Each word must be one of :data:`SCHEDULING_OPTIONS` (or its short form in
    :data:`SCHEDULING_SHORT`), written in full with its value after ``=`` (long) or
    glued on (short): a separate word is where ``sbatch`` takes a value or the script
    to run (``--exclusive my.sh`` would run ``my.sh``)."""
    problems = []
    for arg in extra_args:
        problem = _extra_arg_problem(arg)
        if problem is not None:
            problems.append(f"slurm.extra_args: {arg!r}{problem}")
    return problems


def _extra_arg_problem(arg: str) -> str | None:
    """What is wrong with one word of ``slurm.extra_args`` (the text after the word
    itself), or None."""
    if arg == "--" or not arg.startswith("-") or arg == "-":
        return (
            " is not an option: give values after '=' (--qos=high); a separate word can "
            "be taken by sbatch as the script to run"
        )
    if arg.startswith("--"):
        name, sep, value = arg.partition("=")
        has_value = bool(sep)
        kind = SCHEDULING_OPTIONS.get(name)
        if kind is None:
            return f": {_refused(name)}"
    else:
        letter, value = arg[1], arg[2:]
        long = SCHEDULING_SHORT.get(letter)
        if long is None:
            reserved = RESERVED_SHORT.get(letter)
            why = RESERVED_OPTIONS[reserved] if reserved else "not a scheduling option"
            named = f"-{letter} ({reserved})" if reserved else f"-{letter}"
            return f": {named} is not allowed: {why}; {_allowed()}"
        name, has_value, kind = long, bool(value), VALUE
    if kind == VALUE and not value:
        return f": {name} needs its value in the same word ({name}=...)"
    if kind == FLAG and has_value:
        return f": {name} takes no value"
    if name in NO_FILE_VALUES and "/" in value:
        return f": {name} names nodes here, not a file to read them from"
    return None


def _refused(name: str) -> str:
    """Why the long option ``name`` is refused: its own reason when it is (a prefix
    of) an option Lazarus sets or that changes what the holder runs."""
    for reserved, why in RESERVED_OPTIONS.items():
        if len(name) > 2 and reserved.startswith(name):
            return f"{reserved} is not allowed: {why}"
    if any(option.startswith(name) for option in SCHEDULING_OPTIONS if len(name) > 2):
        return f"{name} is not allowed: write the option in full; {_allowed()}"
    return f"{name} is not a scheduling option Lazarus allows; {_allowed()}"


def _allowed() -> str:
    return "allowed: " + ", ".join(sorted(SCHEDULING_OPTIONS))


def holder_argv(slurm: SlurmSpec, slurm_name: str, run_dir: str | Path) -> list[str]:
    """The ``sbatch`` command line of the holder named ``slurm_name`` (without
    ``--test-only``)."""
    assert slurm.nodes is not None, "submit mode only"
    argv = [
        "sbatch",
        "--parsable",
        "--no-kill",
        "--no-requeue",
        f"--signal=B:USR1@{slurm.notice_s}",
        "-N",
        str(slurm.nodes + slurm.spares),
        f"--job-name={slurm_name}",
        f"--output={Path(run_dir) / 'slurm-holder-%j.out'}",
    ]
    for option, value in (
        ("--partition", slurm.partition),
        ("--time", slurm.time),
        ("--account", slurm.account),
    ):
        if value is not None:
            argv.append(f"{option}={value}")
    return [*argv, *slurm.extra_args, "--wrap", holder_script(run_dir)]


def _blame(error: str) -> str:
    """The spec field Slurm's refusal points at."""
    lowered = error.lower()
    for words, field in (
        (("account",), "slurm.account"),  # "account/partition combination": the account
        (("partition",), "slurm.partition"),
        (("time limit", "time_limit", "invalid time"), "slurm.time"),
        (("node count", "node configuration", "nodes"), "slurm.nodes"),
    ):
        if any(w in lowered for w in words):
            return field
    return "slurm.extra_args"


def _refusal(error: str) -> str:
    lines = [ln.strip() for ln in error.splitlines() if ln.strip()]
    text = " ".join(ln.removeprefix("sbatch: error: ") for ln in lines) or "no reason given"
    return f"{_blame(text)}: Slurm refuses the allocation: {text[:300]}"


def submit_problems(spec: JobSpec) -> list[str]:
    """Why Slurm would refuse the holder (``sbatch --test-only``), one line naming the
    field; empty when it would take it. Submits nothing."""
    assert spec.slurm is not None
    problems = extra_args_problems(spec.slurm.extra_args)
    if problems:
        return problems
    argv = holder_argv(spec.slurm, first_holder_name(spec.name), spec.run_dir)
    try:
        done = run_slurm([argv[0], "--test-only", *argv[1:]])
    except SlurmCommandFailed as exc:
        return [f"slurm: cannot ask Slurm: {exc}"]
    # --test-only answers on stderr either way ("sbatch: Job N to start at ...").
    if done.returncode != 0:
        return [_refusal(done.stderr or done.stdout)]
    return []


def submit(spec: JobSpec) -> int:
    """Submit the holder; its job id. Raises :class:`SubmitRefused`."""
    assert spec.slurm is not None
    return submit_holder(spec.slurm, first_holder_name(spec.name), spec.run_dir)


def first_holder_name(job_name: str) -> str:
    """The name of the holder :func:`start_allocation` submits (and the name
    ``sbatch --test-only`` is asked about). Nothing looks it up by name: the caller
    knows the id ``sbatch`` answers. The workflow's first submit names its holder
    after its run instead (:attr:`SubmitAllocationRequest.holder_name`)."""
    return f"lazarus-{job_name}"


def submit_holder(slurm: SlurmSpec, slurm_name: str, run_dir: str) -> int:
    """Submit a holder named ``slurm_name``; its job id. Raises
    :class:`SubmitRefused`, also for ``slurm.extra_args`` it may not use (the worker
    checks again what a client checked: the spec comes from the workflow input)."""
    problems = extra_args_problems(slurm.extra_args)
    if problems:
        raise SubmitRefused("; ".join(problems))
    Path(run_dir).mkdir(parents=True, exist_ok=True)  # the holder's notice and log
    argv = holder_argv(slurm, slurm_name, run_dir)
    try:
        done = run_slurm(argv)
    except SlurmCommandFailed as exc:
        raise SubmitRefused(f"slurm: cannot submit: {exc}") from None
    if done.returncode != 0:
        raise SubmitRefused(_refusal(done.stderr or done.stdout))
    return int(done.stdout.strip().split(";")[0])


def wait_running(
    job_id: int,
    progress: Callable[[str], None],
    timeout_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    cancelled: threading.Event | None = None,
) -> Allocation:
    """Wait until Slurm runs job ``job_id`` and return it; ``progress`` gets a line
    now and then (its state and Slurm's reason while it waits). Raises
    :class:`SubmitRefused` when it ends first, TimeoutError after ``timeout_s``,
    :class:`SubmitCancelled` once ``cancelled`` is set."""
    started = clock()
    said_at: float | None = None
    said = ""
    stop = cancelled or threading.Event()
    while True:
        if stop.is_set():
            raise SubmitCancelled(f"stopped waiting for Slurm job {job_id}")
        try:
            found = allocation(job_id)
        except SlurmCommandFailed:
            found = None  # a slow controller: ask again
        if found is not None and found.state == RUNNING and found.nodes:
            progress(f"Slurm job {job_id} runs on {found.nodelist}")
            return found
        if found is not None and found.state in ENDED:
            raise SubmitRefused(f"slurm: job {job_id} ended before it ran: {found.state}")
        now = clock()
        line = f"waiting for Slurm job {job_id}: {found.state if found else 'not listed yet'}"
        if line != said or said_at is None or now - said_at >= PROGRESS_EVERY_S:
            progress(f"{line} ({now - started:.0f} s)")
            said, said_at = line, now
        if timeout_s is not None and now - started > timeout_s:
            raise TimeoutError(f"Slurm job {job_id} did not start within {timeout_s:g} s")
        stop.wait(WAIT_POLL_S)


def cancel(job_id: int) -> None:
    """Give the allocation back (the start did not go through)."""
    with contextlib.suppress(SlurmCommandFailed):
        run_slurm(["scancel", str(job_id)])


def start_allocation(
    spec: JobSpec, progress: Callable[[str], None], timeout_s: float | None = None
) -> JobSpec:
    """Submit mode end to end, outside any workflow: check, submit, wait, and the spec
    in the allocation (the Slurm tests' own set-up; a job's first allocation is the
    workflow's :func:`resubmit` with nothing to release). A start that fails after the
    submission cancels what it submitted."""
    problems = submit_problems(spec)
    if problems:
        raise SubmitRefused("; ".join(problems))
    job_id = submit(spec)
    progress(f"submitted the allocation: Slurm job {job_id}")
    try:
        found = wait_running(job_id, progress, timeout_s)
        return spec.in_allocation(job_id, found.nodes)
    except BaseException:
        cancel(job_id)
        progress(f"cancelled Slurm job {job_id}")
        raise


def slurm_user() -> str:
    """The user Slurm runs this process's jobs as: its own jobs are the only ones a
    lookup by name may find (``squeue -u``; ``--me`` needs Slurm 20.11). From the
    uid, not ``$USER``, which the environment can say anything about."""
    return pwd.getpwuid(os.getuid()).pw_name


def own_jobs_named(name: str, exclude: list[int] | None = None) -> list[Allocation]:
    """This user's Slurm jobs called ``name`` that have not ended, except the ids in
    ``exclude`` (a retried activity looks for what an earlier attempt submitted under
    the same name). Another user's job of that name is never listed: adopting it
    would launch into an allocation ``srun`` may not use, and cancelling it would
    end someone else's work.

    Raises :class:`~activities.nodes.slurm.commands.SlurmCommandFailed` when
    ``squeue`` cannot answer: "none found" would be a guess, and a retried resubmit
    that took it for an answer submitted a second holder beside the first attempt's,
    which then held its nodes, unrecorded, until its time limit (issue 37, N11). The
    attempt fails instead, and its retry asks again."""
    done = run_slurm(["squeue", "-h", "-u", slurm_user(), "--name", name, "-o", "%i"])
    if done.returncode != 0:
        raise SlurmCommandFailed(
            f"squeue cannot list this user's Slurm jobs named {name}: "
            f"{one_line(done.stderr or done.stdout)}"
        )
    skip = set(exclude or [])
    ids = [int(word) for word in done.stdout.split() if word.isdigit()]
    found = [allocation(job_id) for job_id in ids if job_id not in skip]
    return [a for a in found if a is not None and a.state not in ENDED]


def size_problem(job_id: int, nodes: list[str], asked: int) -> str | None:
    """Why Slurm job ``job_id`` is not the allocation that was asked for (``asked``
    nodes); None when it is."""
    if len(nodes) == asked:
        return None
    return (
        f"slurm: Slurm job {job_id} holds {len(nodes)} node(s), but {asked} were asked for "
        "(slurm.nodes + slurm.spares); it is not taken"
    )


def resubmit(
    request: SubmitAllocationRequest,
    progress: Callable[[str], None],
    cancelled: threading.Event | None = None,
) -> AllocationGranted:
    """The job's allocation, running: its first (the workflow's first step, nothing to
    release: ``slurm.job_id`` is None) or the new one of a preempted job
    (``slurm.resubmit``).

    1. the old allocation, if any, is cancelled (it is ending anyway, and the queue may need
       its nodes for the new one); ``scancel`` of an ended job is harmless;
    2. a holder named after the workflow run and the resubmission
       (:attr:`~SubmitAllocationRequest.holder_name`) is submitted, unless an earlier
       attempt of this activity already did: that one, this user's job of that name,
       is adopted, never doubled. A job the workflow recorded (the old allocation)
       is never adopted;
    3. it waits for Slurm to run it, at most ``slurm.wait_s``; a holder that does
       not run by then, or whose wait is called off (``cancelled``: the job was
       cancelled meanwhile), is cancelled, so nothing is left queued behind the job;
    4. it must hold the node count asked for: the workflow would place the job's
       nodes and spares on it. One that does not is refused (and cancelled, when it
       is this run's by name, so it holds no nodes for nothing).
    """
    slurm = request.slurm
    assert slurm.nodes is not None, "resubmit is for allocations Lazarus submitted"
    asked = slurm.nodes + slurm.spares
    name = request.holder_name
    known = [*request.known_job_ids, *([slurm.job_id] if slurm.job_id is not None else [])]
    if request.release_old and slurm.job_id is not None:
        cancel(slurm.job_id)
        progress(f"released Slurm job {slurm.job_id}")
    earlier = own_jobs_named(name, exclude=known)
    if earlier:
        job_id = earlier[0].job_id
        progress(f"adopted Slurm job {job_id} ({name}), submitted by an earlier attempt")
    else:
        job_id = submit_holder(slurm, name, request.run_dir)
        progress(f"submitted the new allocation: Slurm job {job_id} ({name})")
    ours = not earlier or request.run_key is not None
    started = time.monotonic()
    try:
        found = wait_running(job_id, progress, timeout_s=slurm.wait_s, cancelled=cancelled)
    except (SubmitRefused, TimeoutError, SubmitCancelled):
        cancel(job_id)
        raise
    problem = size_problem(job_id, found.nodes, asked)
    if problem is not None:
        if ours:
            cancel(job_id)
            problem += f"; cancelled Slurm job {job_id}"
        raise SubmitRefused(problem)
    return AllocationGranted(
        job_id=job_id, nodes=found.nodes, waited_s=round(time.monotonic() - started, 3)
    )


def cancel_submitted(request: SubmitAllocationRequest) -> list[int]:
    """Give back what a submit request submitted, if anything: this user's jobs named
    as its holder (:attr:`SubmitAllocationRequest.holder_name`), except those the
    workflow recorded as its own. The ids cancelled; empty when there were none (the
    submission never reached Slurm). The workflow's compensation for a job cancelled
    while it waited for its first allocation."""
    known = [*request.known_job_ids]
    found = own_jobs_named(request.holder_name, exclude=known)
    for job in found:
        cancel(job.job_id)
    return [job.job_id for job in found]
