"""Every ``workflow.patched`` id of the workflows, in one table.

A patch changes which commands a run issues, so a history recorded before it (a job
started on an older controller, and the corpus in ``tests/fixtures/histories/released/``)
must keep its old path on replay: the code asks ``workflow.patched(PATCH_X)`` and takes
the old path when the history has no marker for it. Jobs run for weeks, so a patch
lives long; this table says, for each one, who owns it, what it changes, which commit
brought it and when it can go.

Retiring a patch takes two releases, as Temporal's ``patching`` sample shows:

1. once no job started before the patch is running (the ``retire`` column), replace
   ``workflow.patched(PATCH_X)`` by ``workflow.deprecate_patch(PATCH_X)`` and the new
   path alone;
2. once no job started before that release runs, delete the call and the constant.

Step 1 also ends replay of the released histories recorded before the patch: they
move out of the replay corpus in the same change (they are never re-recorded).

Rules, checked by ``tests/unit/test_patches.py``: every ``workflow.patched(...)`` call
under ``workflows/`` names a constant imported from here; ids are unique; an id never
changes (it is written in every history that took the new path). Every patch so far
came after the released corpora (``3fe5006``, ``4251617``), so each one's ``retire``
condition is the same: no job started before its commit still runs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Patch:
    """One row of the table."""

    id: str
    """The marker written into history: never changes."""
    owner: str
    """The feature (and module) that asks it."""
    changes: str
    """What the new path does differently."""
    introduced: str
    """The commit (and issue) that brought it."""
    retire: str = "when no job started before `introduced` still runs"
    """When ``deprecate_patch`` may replace it (then, a release later, removal)."""


PATCHES: dict[str, Patch] = {}
"""Every patch by id, in the order they were introduced."""


def _patch(id: str, *, owner: str, changes: str, introduced: str) -> str:
    """Register a row and return its id, the constant the code passes to
    ``workflow.patched``; a second row with the same id is a mistake."""
    if id in PATCHES:
        raise ValueError(f"patch id {id!r} registered twice")
    PATCHES[id] = Patch(id=id, owner=owner, changes=changes, introduced=introduced)
    return id


PATCH_RUN_DIRECTORY = _patch(
    "run-directory-per-start",
    owner="job (run)",
    changes="Each start gets ``<run_dir>/<job_id>/run-<run id>``; older jobs keep "
    "``<job_id>/``, and a new start never sees an earlier start's launch.json, exit "
    "files, fences or escalation markers.",
    introduced="2bbf0ad (issue 10)",
)
PATCH_CONTINUE_AS_NEW_ANY_PHASE = _patch(
    "continue-as-new-in-every-phase",
    owner="hand_over (continue-as-new)",
    changes="Continue-as-new is checked while supervising, paused or waiting for an "
    "operator, waits for every handler first, and a hook that keeps failing no longer "
    "blocks it (its delivery moves to the next run).",
    introduced="2bbf0ad (issue 10)",
)
PATCH_RETIER_AFTER_FALLBACK = _patch(
    "retier-after-fallback",
    owner="checkpoint_steps (resume point)",
    changes="Resuming below the newest tiered step restarts the checkpoint watch there, "
    "so the checkpoints written after a rollback or a fallback are tiered too.",
    introduced="2bbf0ad (issue 10)",
)
PATCH_FAST_RECOVERY = _patch(
    "fast-recovery",
    owner="job (recovery) and stop_steps",
    changes="The recovery fast path: no backoff for the first failure after progress, "
    "no second fence stop of a generation the recovery has just stopped, dead nodes "
    "not contacted on the recovery path, and a cleanup stop at the end of a run that "
    "used warm starts or the memory tier.",
    introduced="5406c1a (issue 12)",
)
PATCH_SLURM_PREEMPTION = _patch(
    "slurm-preemption",
    owner="slurm_steps (preemption)",
    changes="A ``preempted`` supervision outcome (Slurm is taking the allocation away) "
    "is met with a just-in-time checkpoint, a stop and PAUSED.",
    introduced="175f09d (issue 13)",
)
PATCH_SLURM_ALLOCATION = _patch(
    "slurm-allocation-changes",
    owner="slurm_steps (resubmit, grow)",
    changes="The job may change its Slurm allocation: a new one after a preemption "
    "(``slurm.resubmit``), a node more when a lost one has no spare (``slurm.grow``).",
    introduced="75465fd (issue 13)",
)
PATCH_CHECKPOINT_INTERVAL_AUTO = _patch(
    "checkpoint-interval-auto",
    owner="checkpoint_steps (interval tuning)",
    changes="``checkpoints.interval: auto`` sends Young-Daly intervals to the ranks; "
    "asked only by jobs that set it, so other jobs issue exactly the commands they did.",
    introduced="0f04c66 (issue 14)",
)
PATCH_FLEET = _patch(
    "fleet",
    owner="fleet_steps (fleet_link)",
    changes="Jobs with ``spec.fleet`` lease, report and release through their fleet. "
    "Asked only by such jobs: a job without a fleet issues the commands it did.",
    introduced="0f04c66 (issue 14)",
)
PATCH_SEARCH_ATTRIBUTES_V2 = _patch(
    "search-attributes-v2",
    owner="job (phase publishing)",
    changes="``LazarusFailureClass`` and ``LazarusGeneration`` are upserted when they change.",
    introduced="95898c0 (issue 15)",
)
PATCH_HOST_TASK_QUEUE = _patch(
    "host-task-queue",
    owner="routing (run_context)",
    changes="A job of local nodes sends its machine-bound activities to its host's task "
    "queue. Asked only by such jobs: others replay with every activity on the "
    "workflow's own queue.",
    introduced="95898c0 (issue 15)",
)
PATCH_REJOIN = _patch(
    "rejoin-in-place",
    owner="job (recovery)",
    changes="``rejoin``: a crashed rank's survivors keep their process into the next "
    "generation; asked only by jobs that set it.",
    introduced="f20df2b (issue 16)",
)
PATCH_HOUSEKEEPING_STOPS = _patch(
    "housekeeping-stops-when-told",
    owner="housekeeping",
    changes="A loop told to stop ends even when the cancellation reaches it as a failed "
    "upload or collection, or not at all; and the run waits for its loop to end before "
    "it completes (before, a continue-as-new waiting for it hung the job, and commands "
    "after the completion were refused by the server).",
    introduced="5a84e2e, ad1623d (found by bench simulate)",
)
PATCH_HOOK_SURVIVES_CONTINUE_AS_NEW = _patch(
    "escalation-hook-survives-continue-as-new",
    owner="hand_over (hook delivery)",
    changes="A hook delivery cancelled by the run's own continue-as-new stays in "
    "``pending_hooks`` so the next run delivers it; before, the cancellation counted as "
    "a failed delivery and dropped the page.",
    introduced="7f7682f (found by bench simulate)",
)
PATCH_FLEET_HAND_BACK = _patch(
    "fleet-hand-back",
    owner="fleet_steps (fleet_link)",
    changes="A running job gives its fenced quarantined nodes back to its fleet at each "
    "launch, counts the node its incident's stop just reached as fenced, and takes back "
    "a node the fleet hands it again. Asked only by jobs with ``fleet.hand_back``.",
    introduced="84194bb (issue 14)",
)
PATCH_FLEET_WAIT_FOR_NODE = _patch(
    "fleet-wait-for-node",
    owner="fleet_steps (fleet_link)",
    changes="A fleet job waiting for an operator with too few nodes asks its fleet again "
    "every ``fleet.retry_s`` and goes on by itself when the fleet has a node.",
    introduced="13c5167 (issue 14)",
)
PATCH_NODES_BEFORE_RESUME = _patch(
    "node-set-before-resume-point",
    owner="job (launch)",
    changes="A launch runs the preflight (and the swaps, shrink or ``slurm.grow`` it "
    "causes) before the rollback and the resume-point search, so the memory tier is "
    "searched on exactly the nodes that launch; a rejoin planned on nodes the preflight "
    "changed is dropped for a whole-generation restart.",
    introduced="c41fd0d (issue 26)",
)
PATCH_SLURM_OWN_JOBS = _patch(
    "slurm-own-jobs",
    owner="slurm_steps (resubmit)",
    changes="A resubmitted allocation smaller than the job's nodes and spares pauses the "
    "job with the reason, instead of raising ValueError in workflow code (which failed "
    "every workflow task and left the job stuck in RECOVERING).",
    introduced="a7813cd (issue 26)",
)
PATCH_END_OF_RUN_EVERY_NODE = _patch(
    "end-of-run-every-node",
    owner="stop_steps (end-of-run stop)",
    changes="The end-of-run stop reaches every node the run touched, with a bounded "
    "retry, and notes the nodes it could not reach; before, zygotes, idle standbys and "
    "``/dev/shm`` snapshots outlived the run on fenced, returned or handed-back nodes.",
    introduced="587daae (issue 26)",
)
PATCH_FLEET_WAITS_ONLY_FOR_NODES = _patch(
    "fleet-waits-only-for-nodes",
    owner="fleet_steps (fleet_link)",
    changes="The fleet retry resumes a job only when being short of nodes is its whole "
    "reason for waiting (``JobState.waits_for_node``); before, a job that escalated for "
    "a spent budget, a crash loop or stuck ranks relaunched by itself once the fleet "
    "had a node.",
    introduced="a7a541a (issue 26)",
)
PATCH_POOL_LOCK = _patch(
    "pool-edits-locked",
    owner="job (return handler), run_context (pool lock)",
    changes="``return`` holds the pool lock across its fence and release, so it waits for "
    "a recovery, launch or fleet retry that is moving nodes (and they for it); before, "
    "it could release the node between two steps of a swap.",
    introduced="issue 27",
)
PATCH_HANDLERS_FINISH = _patch(
    "handlers-finish-before-return",
    owner="job (run)",
    changes="A run that ends while an update is still running waits for it before it "
    "completes, so its caller gets an answer. Asked only when one is running.",
    introduced="issue 27",
)
PATCH_NO_REJOIN_IN_REJOIN = _patch(
    "no-rejoin-during-a-rejoin",
    owner="recovery_steps (rejoin plan)",
    changes="A failure before the first step of a generation that carried survivors "
    "restarts the whole generation: the survivors are blocked in that generation's "
    "rendezvous, and carrying them again cost a startup timeout (found by the chaos "
    "matrix's survivor_sigkill@rejoin). Asked only in that case.",
    introduced="issue 26",
)
PATCH_NODE_LOSS_RESTARTS_WHOLE = _patch(
    "node-loss-restarts-whole",
    owner="recovery_steps (rejoin plan)",
    changes="With ``rejoin`` on, a node loss restarts the whole generation unless "
    "``rejoin.node_loss`` is set: the lost host's peers stay blocked in their collective "
    "until the process group's timeout (no socket closes), while the whole generation "
    "restarts warm in seconds (measured in the multi-node bench). Before, a node loss "
    "always rejoined. Asked only for a node loss of a job with rejoin on and "
    "``node_loss`` off.",
    introduced="issue 28",
)
PATCH_PAUSED_STAYS_PAUSED = _patch(
    "paused-stays-paused",
    owner="job (force_recover signal)",
    changes="A forced recovery sent to a paused job is refused (recorded as ignored, "
    "with the reason): before, it quietly resumed the job. The update form refuses in "
    "its validator, which replay does not run. Asked only for the signal form while "
    "paused (issue 29).",
    introduced="issue 29",
)
PATCH_SLURM_FIRST_SUBMIT = _patch(
    "slurm-first-submit",
    owner="slurm_steps (first submit)",
    changes="A submit-mode job (``slurm.nodes``) starts PENDING without an allocation; "
    "its first step submits it (``submit_allocation``, token ``start``), waits for it "
    "to run and records it in ``JobState.roster``, or fails with Slurm's answer; a job "
    "cancelled meanwhile gives it back (``cancel_allocation``). Before, ``lazarus start`` "
    "submitted it outside the workflow. Asked only by such jobs: histories of jobs "
    "started in an allocation never ask it.",
    introduced="issue 27",
)
PATCH_MISSING_PROGRAM_FAILS_JOB = _patch(
    "missing-program-fails-job",
    owner="preflight_steps (check_active_nodes)",
    changes="When the preflight finds the command's program missing on every active node "
    "(or on the only one), the job ends FAILED asking for a fixed ``command``: a typo in "
    "the spec is not a node fault. Before, each node was quarantined and, with no spare "
    "left, the job waited in NEEDS_OPERATOR advising to shrink. Asked only in that case "
    "(issue 29).",
    introduced="issue 29",
)
PATCH_PREFLIGHT_BESIDE_SEARCH = _patch(
    "preflight-beside-resume-search",
    owner="job (launch), checkpoint_steps (search_beside)",
    changes="A launch runs the preflight and the resume-point search (after the rollback, "
    "when one is pending) at once instead of one after the other: the search is made "
    "for the nodes the launch plans on, and made again, after the preflight, only when "
    "the preflight changed them (a swap, a shrink, ``slurm.grow``), so the memory tier "
    "is still searched on exactly the nodes that launch. Saves the preflight's round "
    "trip on every relaunch (issue 28, node loss).",
    introduced="issue 28",
)
PATCH_REJOIN_HANDS_BACK = _patch(
    "rejoin-hands-back-replaced-node",
    owner="recovery_steps (rejoin plan)",
    changes="With ``rejoin`` on, a node the playbook replaces is stopped alone (its "
    "peers keep their process); a stop that reached it now marks it fenced, so a fleet "
    "job hands it back (``fleet.hand_back``), as a whole-generation restart always did. "
    "Before, such a node stayed quarantined in the job until it ended: found by the "
    "simulator's rejoin row, whose fleet ran out of nodes to replace with. Asked only "
    "when a hand-back follows.",
    introduced="issue 28",
)
