"""The vocabulary of failures Lazarus can tell apart.

Each member names *why* a distributed training run stopped, because the right
reaction differs: retry in place, cordon a node, shrink the batch, roll back to
an older checkpoint, or stop and page a human. The classifier in
:mod:`lazarus.domain.classifier` maps a log tail onto one of these; ``hang`` and
``node_lost`` come mostly from Lazarus's own health checks rather than from a
rank's log. Standard library only, so training ranks can import it for free.
"""

from __future__ import annotations

from enum import StrEnum


class FailureClass(StrEnum):
    """Why a training job (or one of its ranks) stopped. Values are stable strings."""

    NCCL_TIMEOUT = "nccl_timeout"
    """A collective did not finish in time: the NCCL watchdog's "collective operation
    timeout", a blocking-wait timeout, or a gloo send/recv timeout. Usually a symptom
    of a slow or dead peer rather than a cause."""

    NCCL_ERROR = "nccl_error"
    """NCCL (or the gloo transport) failed other than by timing out: ncclRemoteError,
    ncclInternalError, ncclSystemError, NET/IB completion or port errors, socket or
    shared-memory transport failures."""

    GPU_HARDWARE = "gpu_hardware"
    """The GPU or its driver reported a hardware-level fault: uncorrectable ECC, an Xid
    event, the GPU falling off the bus or being lost, NVLink or PCIe errors. The node
    should be cordoned."""

    OOM_GPU = "oom_gpu"
    """The GPU ran out of device memory ("CUDA out of memory", torch.OutOfMemoryError)."""

    OOM_HOST = "oom_host"
    """Host RAM ran out and the process was killed: kernel or cgroup OOM killer, Slurm
    oom-kill, memory monitors (Ray, systemd-oomd, earlyoom, Kubernetes OOMKilled).
    Lazarus's supervisor says so only with evidence: an OOM message in the log, or the
    kernel's own record (the rank's cgroup ``memory.events`` ``oom_kill`` counter rose,
    or the kernel log names its pid). Log
    text from other launchers ("exitcode: -9") is still read as this class by
    :func:`lazarus.domain.classifier.classify`, which reports it as circumstantial."""

    KILLED = "killed"
    """The rank was killed by SIGKILL from outside and nothing says why: no OOM message,
    no kernel OOM record. An operator's ``kill -9``, a scheduler, a watchdog, or an OOM
    kill the kernel did not let us see. Restarted in place by default."""

    USER_CODE = "user_code"
    """A bug in the training script or its configuration: import errors, Python
    exceptions, bad paths or CLI arguments, shape or state-dict mismatches, DDP
    misuse. Retrying will not help."""

    RENDEZVOUS = "rendezvous"
    """The process group never formed: port already in use, master address that does
    not resolve, store or rendezvous connection timed out, or the store-based init
    barrier timed out."""

    STORAGE = "storage"
    """Checkpoint storage failed: disk full, I/O error while saving, or a corrupt or
    truncated checkpoint on load."""

    PREEMPTED = "preempted"
    """The job was stopped from outside by a signal: scheduler time limit, preemption
    or requeue, SIGTERM / SIGHUP delivered to the launcher."""

    NUMERICAL = "numerical"
    """Training diverged: loss or grad norm became NaN/Inf, or fp16 overflows drove the
    loss scale to its minimum. Usually needs a rollback, not a plain restart."""

    HANG = "hang"
    """No progress for longer than the job's hang timeout. Detected by Lazarus's
    heartbeat monitoring, not from log text."""

    NODE_LOST = "node_lost"
    """A whole node disappeared: the scheduler reports a node failure or the node
    stopped answering, taking all of its ranks with it."""

    UNKNOWN = "unknown"
    """Nothing in the evidence matched a known failure signature."""


PLAYBOOK_CLASSES = frozenset({*(c.value for c in FailureClass), "straggler"})
"""Keys a job spec's ``playbook`` may hold: every failure class, plus ``straggler``,
accepted only so that jobs started with it still decode (a spec file may not set it:
see ``lazarus.domain.spec.STRAGGLER_PLAYBOOK_REFUSED``)."""
