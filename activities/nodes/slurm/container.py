"""What a Slurm node runs for each rank's task: the node's own interpreter with
``lazarus-rank`` (``<python> -m lazarus.rank.slurm_task task ...``), on the node or
in the container ``slurm.container`` names.

- ``pyxis`` (pyxis + enroot): ``srun --container-image=IMAGE
  [--container-mounts=M,...] [--container-*...]``; refused, naming the reason, where
  this Slurm's ``srun --help`` has no ``--container-image`` (pyxis is not installed);
- ``apptainer``: the task is ``apptainer exec [OPTIONS] [--bind M]... IMAGE <python>
  -m lazarus.rank.slurm_task ...``, ``apptainer`` found on the ranks' PATH on the node.

Either way the image must hold the interpreter with ``lazarus-rank`` (and the
training code's own dependencies), and the run directory, ``checkpoint_dir`` and
``workdir`` must be mounted at the same paths: the task writes the rank's pid, exit
and log files where the controller reads them.
"""

from __future__ import annotations

import functools
import subprocess

from lazarus.domain.spec import SlurmSpec

TASK_MODULE = "lazarus.rank.slurm_task"
"""The task's module, in ``lazarus-rank`` (standard library only)."""
PYXIS_OPTION = "--container-image"


class ContainerRefused(ValueError):
    """This site cannot run the container as the spec asks; the message says why."""


def task_argv(python: str, arguments: list[str]) -> list[str]:
    """The task's command on the node, before any container."""
    return [python, "-m", TASK_MODULE, "task", *arguments]


def srun_options(slurm: SlurmSpec | None, srun_help: str | None = None) -> list[str]:
    """The ``srun`` options ``slurm.container`` adds to a rank step (pyxis); raises
    :class:`ContainerRefused` where pyxis is missing. ``srun_help`` stands in for
    ``srun --help``'s text (tests)."""
    container = slurm.container if slurm is not None else None
    if container is None or container.runtime != "pyxis":
        return []
    problem = pyxis_problem(srun_help)
    if problem is not None:
        raise ContainerRefused(problem)
    options = [f"--container-image={container.image}"]
    if container.mounts:
        options.append(f"--container-mounts={','.join(container.mounts)}")
    return [*options, *container.options]


def wrapped(slurm: SlurmSpec | None, argv: list[str]) -> list[str]:
    """``argv`` inside an Apptainer container when ``slurm.container`` asks for one."""
    container = slurm.container if slurm is not None else None
    if container is None or container.runtime != "apptainer":
        return argv
    binds = [word for mount in container.mounts for word in ("--bind", mount)]
    return ["apptainer", "exec", *container.options, *binds, container.image, *argv]


def pyxis_problem(srun_help: str | None = None) -> str | None:
    """Why ``slurm.container`` (runtime pyxis) cannot run here, or None."""
    text = srun_help if srun_help is not None else _srun_help()
    if PYXIS_OPTION in text:
        return None
    return (
        "slurm.container: runtime pyxis needs the pyxis plugin (srun --container-image), "
        "and this Slurm's 'srun --help' has no --container-image; install pyxis and "
        "enroot on the cluster, use runtime: apptainer, or remove slurm.container"
    )


@functools.cache
def _srun_help() -> str:
    from activities.nodes.slurm.commands import client_environment, slurm_command

    try:
        done = subprocess.run(
            [slurm_command("srun"), "--help"],
            env=client_environment(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return f"<srun --help failed: {exc}>"
    return done.stdout + done.stderr
