"""``slurm.extra_args`` is an allow-list of ``sbatch`` scheduling options (issue 37,
N9). The worker itself runs ``sbatch`` with them, and the spec comes from the workflow
input, so they must never choose what the holder runs: the deny-list before the
allow-list missed ``--container`` (an OCI bundle whose root filesystem supplies the
``sh`` that runs the holder's script). Pure: no Slurm, no process."""

from __future__ import annotations

import pytest

from activities.nodes.slurm.submit import SCHEDULING_OPTIONS, extra_args_problems

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    ("arg", "says"),
    [
        ("--container=/tmp/bundle", "--container is not allowed: an OCI bundle"),
        ("--container-id=x", "--container-id is not allowed"),
        ("--bb=stage_in", "--bb is not a scheduling option Lazarus allows"),
        ("--clusters=other", "--clusters is not a scheduling option Lazarus allows"),
        ("--propagate=ALL", "--propagate is not a scheduling option Lazarus allows"),
        ("--export=ALL,PATH=/tmp/x", "--export is not allowed: it sets the holder's environment"),
        ("--qo=high", "write the option in full"),
        ("--qos", "--qos needs its value in the same word"),
        ("--contiguous=yes", "--contiguous takes no value"),
        ("--exclude=/etc/hosts", "names nodes here, not a file"),
        ("-C", "--constraint needs its value"),
        ("-Hgpu", "-H is not allowed: not a scheduling option"),
        ("-Jother", "-J (--job-name) is not allowed"),
        ("-D/tmp", "-D (--chdir) is not allowed: the holder runs where Lazarus starts it"),
        ("my.sh", "is not an option"),
    ],
)
def test_anything_but_a_scheduling_option_is_refused_naming_it(arg: str, says: str) -> None:
    (problem,) = extra_args_problems(["--qos=high", arg])
    assert problem.startswith(f"slurm.extra_args: {arg!r}") and says in problem, problem


def test_a_refusal_lists_what_is_allowed() -> None:
    (problem,) = extra_args_problems(["--bb=stage_in"])
    assert "; allowed: --account, --begin, " in problem
    assert all(f"{option}," in problem for option in ("--constraint", "--gres", "--qos"))


@pytest.mark.parametrize(
    "args",
    [
        ["--qos=high", "--exclusive", "-Cgpu", "--gres=gpu:8"],
        ["--exclusive=user", "--mem=0", "--reservation=maint", "--constraint=a100&ib"],
        ["--nodelist=n[1-4]", "--exclude=n7", "-xn8", "--gpus-per-node=8", "--nice"],
        ["--dependency=afterok:12", "--begin=now+1hour", "--comment=run 3", "-qlow"],
        # Allowed before the allow-list, and harmless: kept, so no running job's
        # resubmission is refused after an upgrade.
        ["--partition=gpu", "--time=4:00:00", "--account=ml", "-pgpu", "-t60", "-Aml"],
    ],
)
def test_ordinary_scheduling_options_pass(args: list[str]) -> None:
    assert extra_args_problems(args) == []


def test_no_allowed_option_changes_what_runs_or_where_it_logs() -> None:
    """A guard on the list itself, so an addition that reopens S3 fails here."""
    words = ("container", "export", "env", "wrap", "chdir", "output", "error", "input", "uid")
    assert not [o for o in SCHEDULING_OPTIONS if any(w in o for w in words)]
