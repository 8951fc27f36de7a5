"""What ``lazarus start`` checks before a job exists, run by a worker (issue 40, part 2).

The CLI is a client: it sends :class:`~lazarus.domain.worker_calls.StartCheckRequest`
through the call workflow (``workflows/worker_call.py``), and this activity answers on
the worker, where the launch itself will run: the program resolved by the launcher's own
rule with the worker's PATH, ssh nodes reached with the worker's keys and
``~/.ssh/config``, the Slurm allocation asked of the worker's Slurm client, and the
checkpoint directory as the worker sees it. Bad input comes back as problem lines naming
the spec file and field; the CLI refuses the start and nothing is moved or started.

Then, only when nothing is wrong: ``--fresh`` sets the checkpoints aside, and the resume
point the first launch would take is planned read-only. A dry run contacts no node and
no scheduler and moves nothing; it returns each node's and rank's plan, made by the
functions the launch uses (:func:`activities.launcher.rank_environment`,
:mod:`activities.nodes.node_plan`), so it cannot drift from them.
"""

from __future__ import annotations

import asyncio
import os

from temporalio import activity

from activities.checkpoints.resume_plan import FreshRefused, plan_resume, start_fresh
from activities.launcher import rank_environment
from activities.nodes import allocation, node_plan
from activities.preflight import check_nodes
from activities.program import resolve_program
from lazarus.domain import environment as env_names
from lazarus.domain.activity_refs import START_CHECKS
from lazarus.domain.checkpoint_views import ResumePlan, resume_ref
from lazarus.domain.contracts import CheckpointRef, NodeAccess, PreflightActivityRequest
from lazarus.domain.run_layout import GenerationDir, job_root
from lazarus.domain.spec import JobSpec, checks_workdir_here
from lazarus.domain.worker_calls import NodePlan, StartCheckRequest, StartCheckResult

# Dry-run placeholders: what only the launch itself can know, marked as such.
RUN_KEY_PLACEHOLDER = "run-<run id>"
"""Each start of a job gets ``run-<Temporal run id>`` under ``{run_dir}/{job_id}``."""
GENERATION_DIR_PLACEHOLDER = "gen-<NNNNN>"
"""Generation ``N`` runs in ``gen-NNNNN`` (zero-padded to five digits)."""
PLACEHOLDERS: dict[str, str] = {
    env_names.MASTER_PORT: "<port chosen at launch>",
    env_names.GENERATION: "<generation: 1, then +1 per restart>",
    env_names.RESTART_COUNT: "<generation - 1>",
    env_names.MEMORY_REPLICA_SECRET: "<the run's replica secret: on the ranks only, never shown>",
    env_names.MEMORY_REPLICA_LISTEN: "<this node's address>:<port derived from the secret>",
    env_names.MEMORY_REPLICA_TO: "<the buddy's address>:<port derived from the secret>",
}
"""Variables whose value the launcher picks per generation, shown as placeholders."""

DRY_RUN_SECRET = "00" * 32
"""Stands in for the run's replica secret: the dry run shows a placeholder and never
reads or creates the worker's key."""


@activity.defn(name=START_CHECKS.name)
async def start_checks(request: StartCheckRequest) -> StartCheckResult:
    """The checks off the event loop (ssh logins and ``sbatch --test-only`` block)."""
    return await asyncio.to_thread(check_start, request)


def check_start(request: StartCheckRequest) -> StartCheckResult:
    spec = request.spec
    problems: list[str] = []
    warnings: list[str] = []
    if request.check_nodes:
        missing = missing_local_program(spec)
        if missing is not None:
            problems.append(f"{request.spec_file}: {missing}")
    own_hosts = any(n.transport.own_host for n in (*spec.nodes, *spec.spares))
    if request.check_nodes and not request.dry_run and not problems and own_hosts:
        refused, warned = unusable_nodes(spec)
        problems += [f"{request.spec_file}: {line}" for line in refused]
        warnings += warned
    if spec.slurm is not None and not request.dry_run and not problems:
        # submit mode: sbatch --test-only, nothing submitted
        problems += [f"{request.spec_file}: {p}" for p in allocation.start_problems(spec)]
    if problems:
        return StartCheckResult(problems=problems, warnings=warnings)
    set_aside = []
    if request.fresh and not request.dry_run:
        try:
            set_aside = start_fresh(spec)
        except FreshRefused as exc:
            return StartCheckResult(refusal=str(exc), warnings=warnings)
    resume: ResumePlan | None = None
    unreadable: str | None = None
    if not (request.fresh and request.dry_run):
        try:
            resume = plan_resume(spec)
        except (OSError, ValueError) as exc:
            unreadable = f"cannot inspect {spec.checkpoint_dir} for a resume point: {exc}"
    result = StartCheckResult(
        warnings=warnings, set_aside=set_aside, resume=resume, resume_unreadable=unreadable
    )
    if not request.dry_run:
        return result
    return result.model_copy(
        update={
            "ranks": rank_environment_plan(spec, resume_ref(resume, spec)),
            "nodes": [NodePlan(**fields) for fields in node_plan.node_plans(spec)],
            "submit": node_plan.submit_argv(spec),
        }
    )


def missing_local_program(spec: JobSpec) -> str | None:
    """A job on this machine whose program does not exist: a typo in ``command``,
    refused before anything starts (the preflight would find it too, but then the job
    exists, and a wrong ``command`` is the spec's fault, not the node's). Resolved by
    the launcher's own rule (:func:`activities.program.resolve_program`: the worker's
    interpreter first, then PATH, or ``env.PATH``). Jobs on other machines are checked
    there: ``unusable_nodes`` for ssh, the workflow's preflight for every node."""
    if not checks_workdir_here(spec) or resolve_program(spec) is not None:
        return None
    program = spec.command[0]
    where = (
        f"in workdir {spec.workdir} (or not executable: chmod +x)"
        if os.sep in program
        else "on PATH" + (" (env.PATH)" if "PATH" in spec.env else "")
    )
    return (
        f"command: program {program!r} not found {where}; fix `command` (a list: "
        "[program, arg, ...]) and start again; nothing was started"
    )


def unusable_nodes(spec: JobSpec) -> tuple[list[str], list[str]]:
    """Bad hosts are bad input: a wrong host key, an unreachable host or a bad identity
    file is reported, naming the node, and nothing is started. Returns ``(problems,
    warnings)``: a bad spare is worth a warning, not a refusal."""
    everything = [*spec.nodes, *spec.spares]
    report = check_nodes(
        PreflightActivityRequest(
            access=NodeAccess(nodes=everything, ssh=spec.ssh),  # ssh nodes: no Slurm
            checks=spec.preflight,
            interpreter=spec.command[0],
            workdir=spec.workdir,
            disk_path=spec.checkpoint_dir,
            search_path=spec.env.get("PATH"),
        )
    )
    where = {n.name: f"nodes[{i}]" for i, n in enumerate(spec.nodes)}
    where.update({n.name: f"spares[{i}]" for i, n in enumerate(spec.spares)})
    spares = {n.name for n in spec.spares}
    problems: list[str] = []
    warnings: list[str] = []
    for health in report.failed:
        for problem in health.problems:
            line = f"{where[health.node]} ({health.node}): {problem}"
            if health.node in spares:
                warnings.append(f"warning: {line}")
            else:
                problems.append(line)
    return problems, warnings


def _worker_variable(name: str) -> str:
    return f"<{name} from the worker's environment>"


def rank_environment_plan(
    spec: JobSpec, resume: CheckpointRef | None = None
) -> list[dict[str, str]]:
    """Each rank's environment as the launcher sets it for the first generation.

    Calls the launcher's own ``rank_environment``, so the dry run cannot drift from
    it, with placeholders where only the launch knows the value: the run key, the
    generation's folder and number, the port. ``pass_env`` values are placeholders
    too (a dry run shows no secret), and ``env_from_file`` is not read (it holds
    secrets, on the node).
    """
    gen = GenerationDir.of(job_root(spec.run_dir, spec.job_id) / RUN_KEY_PLACEHOLDER, 1)
    shown_gen = str(gen.path.parent / GENERATION_DIR_PLACEHOLDER)
    worker_env = {name: _worker_variable(name) for name in spec.pass_env}
    unread = spec.model_copy(update={"env_from_file": None})
    nodes = node_plan.planned_nodes(spec)
    remote = node_plan.remote_placeholders(spec, nodes)
    plan: list[dict[str, str]] = []
    for node_index in range(len(nodes)):
        for local_rank in range(spec.nproc_per_node):
            rank = node_index * spec.nproc_per_node + local_rank
            env = rank_environment(
                unread,
                nodes,
                node_index,
                gen,
                rank,
                0,
                resume,
                worker_env=worker_env,
                replica_secret=DRY_RUN_SECRET,
            )
            for name, value in env.items():
                if value.startswith(str(gen.path)):
                    env[name] = shown_gen + value.removeprefix(str(gen.path))
            env.update({name: shown for name, shown in PLACEHOLDERS.items() if name in env})
            env.update(remote)
            plan.append(env)
    return plan
