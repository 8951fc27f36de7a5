"""Slurm nodes: the agent that runs each generation as a job step in the job's
allocation (``agent``, over ``drain`` and ``warm``), the shim run through ``srun``
(``shim``), batched ``squeue``/``sacct`` rounds (``rounds``), and the allocation itself:
``commands``, ``submit``, ``grow``, ``container``, ``preemption``. The task entry point
that steps run stays at :mod:`activities.nodes.slurm_task` (steps started before a
move still name it)."""
