"""The classifier's rule table: weighted regular-expression rules, one block per
:class:`~lazarus.domain.failure_classes.FailureClass`, that :mod:`lazarus.domain.classifier`
(the engine: scanning, scoring, the symptom discount, the verdict) runs over a log.

Every rule targets wording that the real stack prints (PyTorch / c10d /
ProcessGroupNCCL, NCCL itself, torchrun's elastic agent, DeepSpeed, Lightning, Slurm,
the NVIDIA driver, the Linux kernel, Ray, gloo), not anything specific to one job.
Weights are on one scale: >= 10 means "this line alone settles it", 5-8 strong,
<= 4 supporting. A rule only runs on the lines around its *needles* (lowercase
literals, one of which occurs in or right next to every line its regex can match);
*hint* rules are capped per class by the engine; ``requires=`` names a context rule
that must match somewhere in the log; ``cause=`` spares a symptom class's rule the
symptom discount.

Data, not code: adding a rule is one ``_rule(...)`` line here, and the engine does
not change. Pure and standard-library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lazarus.domain.failure_classes import FailureClass

__all__ = ["RULES", "VOCAB_CHUNK", "VOCAB_STEP", "Rule"]

_FC = FailureClass

VOCAB_CHUNK = 96  # the engine stores longer "words" as overlapping chunks of this size
VOCAB_STEP = 64  # ...starting every this many letters (so gate words must be <= 32)


@dataclass(frozen=True)
class Rule:
    failure_class: FailureClass
    weight: float
    pattern: re.Pattern[str]
    needles: tuple[str, ...]
    hint: bool
    min_count: int
    # per needle, its runs of letters/underscores: all must occur in the log's vocabulary
    gates: tuple[tuple[bytes, ...], ...]
    # a context rule that must match somewhere in the log for this rule to count
    requires: Rule | None = None
    # a hit makes its class a concrete cause even if it is a symptom class (the engine's
    # _SYMPTOM_CLASSES)
    cause: bool = False


_WORD_RE = re.compile(r"[a-z_]+")


def _rule(
    failure_class: FailureClass,
    weight: float,
    regex: str,
    *needles: str,
    hint: bool = False,
    min_count: int = 1,
    case: bool = False,
    requires: Rule | None = None,
    cause: bool = False,
) -> Rule:
    """Build one rule. ``needles`` are lowercase literals, at least one of which
    occurs in (or right next to) every line the regex can match.

    ``requires`` is a context rule (its class is ignored) that must match somewhere
    in the log for this rule to count: a wording that is ambiguous on its own (a bus
    error, a failed name lookup) names its cause only next to that context.
    ``cause`` marks a rule of a symptom class (NCCL) whose hit is a root cause, not
    a consequence of another rank's failure, so the symptom discount spares it."""
    if not needles or any(n != n.lower() or not n for n in needles):
        raise ValueError(f"rule {regex!r} needs non-empty lowercase needles")
    flags = re.MULTILINE | (0 if case else re.IGNORECASE)
    gates = tuple(tuple(w.encode() for w in _WORD_RE.findall(n)) for n in needles)
    if any(len(w) > VOCAB_CHUNK - VOCAB_STEP for g in gates for w in g):
        raise ValueError(f"rule {regex!r}: needle words must be <= 32 letters")
    pattern = re.compile(regex, flags)
    return Rule(failure_class, weight, pattern, needles, hint, min_count, gates, requires, cause)


def _context(regex: str, *needles: str, case: bool = False) -> Rule:
    """A context for ``requires=``: only ever matched, never scored."""
    return _rule(_FC.UNKNOWN, 0, regex, *needles, case=case)


# NCCL is in the process: its symbols in a backtrace (ncclGroupEnd, ncclCommInitRank),
# libnccl.so, its INFO/WARN lines, or torch's ProcessGroupNCCL.
_NCCL_CONTEXT = _context(
    r"libnccl|\bnccl[A-Z][A-Za-z]+\b|\bNCCL\s+(?:INFO|WARN)\b|ProcessGroupNCCL",
    "nccl",
    case=True,
)
# The log comes from a torch.distributed job: a name lookup failing there is the
# rendezvous address (MASTER_ADDR, the rdzv endpoint, the store host).
_DISTRIBUTED_CONTEXT = _context(
    r"MASTER_ADDR|TCPStore|\bc10d\b|rendezvous|init_process_group|torchrun|torch\.distributed|"
    r"socket\.cpp|elastic|\bpdsh\b|deepspeed|\bmpirun\b|horovod|hostfile|\betcd\b",
    "master_addr",
    "tcpstore",
    "c10d",
    "rendezvous",
    "init_process_group",
    "torchrun",
    "torch.distributed",
    "socket.cpp",
    "elastic",
    "pdsh",
    "deepspeed",
    "mpirun",
    "horovod",
    "hostfile",
    "etcd",
)
# The kernel or NVML says the GPU is gone or must be reset.
_GPU_RESET_CONTEXT = _context(
    r"NVRM:|\bXid\b|fallen\s+off|\bGPU\s+(?:is|has\s+been)\s+lost\b|requires?\s+(?:a\s+)?reset|"
    r"Reset\s+Required|Recovery\s+Action|Unable\s+to\s+determine\s+the\s+device\s+handle",
    "nvrm",
    "xid",
    "fallen off",
    "lost",
    "reset",
    "recovery action",
    "device handle",
)


# fmt: off
RULES: tuple[Rule, ...] = (
    # ------------------------------------------------------------------ nccl_timeout
    # ProcessGroupNCCL watchdog: "[Rank 0] Watchdog caught collective operation timeout:
    # WorkNCCL(SeqNum=808, OpType=ALLREDUCE, ..., Timeout(ms)=600000) ran for 600020
    # milliseconds before timing out." Also the NCCL_BLOCKING_WAIT wording "Caught
    # collective operation timeout" and other backends (HCCL, ...) that copied it.
    _rule(_FC.NCCL_TIMEOUT, 12, r"collective\s+operation\s+timeout", "collective"),
    # "... ran for 600020 milliseconds before timing out."
    _rule(_FC.NCCL_TIMEOUT, 6, r"ran\s+for\s+\d+\s+milliseconds\s+before\s+timing\s+out", "timing"),
    # "Work WorkNCCL(SeqNum=2521, ...) timed out in blocking wait."
    _rule(_FC.NCCL_TIMEOUT, 9, r"timed\s+out\s+in\s+blocking\s+wait", "blocking"),
    # newer torch: "[PG ID 0 PG GUID 0(default_pg) Rank 1] Timeout at NCCL work: 808, last
    # enqueued NCCL work: 811, last completed NCCL work: 807."
    _rule(_FC.NCCL_TIMEOUT, 9, r"Timeout\s+at\s+NCCL\s+work", "timeout at"),
    # "Some NCCL operations have failed or timed out. Due to the asynchronous nature of
    # CUDA kernels, ..." - printed for errors too, but overwhelmingly after timeouts.
    _rule(_FC.NCCL_TIMEOUT, 4, r"NCCL\s+operations\s+have\s+failed\s+or\s+timed\s+out",
          "timed out"),
    # gloo: "[gloo/transport/tcp/unbound_buffer.cc:72] Timed out waiting 1800000ms for recv
    # operation to complete" (and the send variant).
    _rule(_FC.NCCL_TIMEOUT, 11,
          r"Timed\s+out\s+waiting\s+\d+\s*ms\s+for\s+(?:recv|send)\s+operation",
          "timed out"),
    # gloo (torch >= 2.x, tcp pair): "RuntimeError: Application timeout caused pair
    # closure" - the pair is torn down because the collective's timeout expired.
    _rule(_FC.NCCL_TIMEOUT, 11, r"Application\s+timeout\s+caused\s+pair\s+closure",
          "application timeout"),
    # monitored_barrier: "Rank 1 failed to pass monitoredBarrier in 2000 ms"
    _rule(_FC.NCCL_TIMEOUT, 9, r"failed\s+to\s+pass\s+monitoredBarrier", "monitoredbarrier"),
    # heartbeat monitor: "Heartbeat monitor timed out! Process will be terminated after
    # dumping debug info." / "ProcessGroupNCCL's watchdog got stuck for 480 seconds without
    # making progress in monitoring enqueued collectives."
    _rule(_FC.NCCL_TIMEOUT, 8, r"Heartbeat\s+monitor\s+timed\s+out", "heartbeat"),
    _rule(_FC.NCCL_TIMEOUT, 8, r"watchdog\s+got\s+stuck\s+for", "stuck"),
    # "Exception (either an error or timeout) detected by watchdog at work: 808"
    _rule(_FC.NCCL_TIMEOUT, 1, r"either\s+an\s+error\s+or\s+timeout", "either an error", hint=True),
    # The watchdog's C++ stack when a report quotes it without the timeout line above it:
    # "frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<...>) + 0x1d2"
    # or "Exception raised from checkTimeout at .../ProcessGroupNCCL.cpp:632". checkTimeout
    # throws only the timeout (errors are raised from checkForNCCLErrors / the CUDA checks),
    # so it names the class; still a symptom, discounted when another rank's cause is quoted.
    _rule(_FC.NCCL_TIMEOUT, 8,
          r"Exception\s+raised\s+from\s+checkTimeout\b|WorkNCCL::checkTimeout\b",
          "checktimeout"),

    # ------------------------------------------------------------------ nccl_error
    # "torch.distributed.DistBackendError: NCCL error in: .../ProcessGroupNCCL.cpp:1182,
    # internal error - please report this issue to the NCCL developers, NCCL version 2.18.3"
    # and older "RuntimeError: NCCL error in: ../torch/lib/c10d/ProcessGroupNCCL.cpp:825,
    # unhandled system error, NCCL version 2.7.8"; "NCCL Error 2: unhandled system error".
    _rule(_FC.NCCL_ERROR, 8, r"NCCL\s+error\s+in\s*:", "nccl error"),
    _rule(_FC.NCCL_ERROR, 7,
          r"NCCL\s+error\s*(?:\d+\s*)?:\s*(?:unhandled|internal|remote|invalid|system)",
          "nccl error"),
    # the result codes NCCL prints on the next line: "ncclRemoteError: A call failed
    # possibly due to a network error or a remote process exiting prematurely."
    _rule(_FC.NCCL_ERROR, 8,
          r"\bnccl(?:Remote|Internal|System|UnhandledCuda|InvalidUsage|"
          r"InvalidArgument)(?:Error)?\b",
          "ncclremote", "ncclinternal", "ncclsystem", "ncclunhandledcuda", "ncclinvalid"),
    _rule(_FC.NCCL_ERROR, 7, r"remote\s+process\s+exited\s+or\s+there\s+was\s+a\s+network\s+error",
          "remote process"),
    # any NCCL warning ("host:pid:tid [dev] misc/socket.cc:538 NCCL WARN Net : Connection
    # closed by remote peer"), except the harmless plugin-loading chatter.
    _rule(_FC.NCCL_ERROR, 4,
          r"NCCL\s+WARN\b(?!.*(?:plugin|libnccl-net|No\s+such\s+file|Could\s+not\s+find))",
          "nccl warn"),
    # InfiniBand / RoCE: "NET/IB : Got completion from peer 10.0.0.2<54862> with status=12
    # opcode=0 len=0 vendor err 129 (Recv)", "NET/IB : Got async event : port error".
    _rule(_FC.NCCL_ERROR, 9, r"NET/IB\w*\s*:\s*Got\s+(?:completion|async\s+event)", "net/ib"),
    _rule(_FC.NCCL_ERROR, 8, r"Call\s+to\s+ibv_\w+\s+failed", "ibv_"),
    # AWS EFA: "NET/OFI Request 0x7f... completed with error. RC: 113."
    _rule(_FC.NCCL_ERROR, 8, r"NET/OFI\b.*(?:error|failed)", "net/ofi"),
    # socket transport: "Net : Connection closed by remote peer host<47861>", "Call to recv
    # from 10.0.0.1<58355> failed : Broken pipe", "socketProgressOpt: Call to recv ... failed"
    _rule(_FC.NCCL_ERROR, 7,
          r"\bNet\s*:\s*(?:Connection\s+closed\s+by\s+remote\s+peer|"
          r"Call\s+to\s+\w+\s+from\s+\S+\s+failed)",
          "net :", "net:"),
    _rule(_FC.NCCL_ERROR, 5, r"NET/Socket\b.*(?:error|failed|closed)", "net/socket"),
    # shared memory transport: "Error while creating shared memory segment /dev/shm/nccl-...",
    # "Error while attaching to shared memory segment".
    _rule(_FC.NCCL_ERROR, 8,
          r"Error\s+while\s+(?:creating|attaching\s+to)\s+shared\s+memory\s+segment",
          "shared memory segment", cause=True),
    # ...and the rest of the shm transport's failure wording: "include/shm.h:28 NCCL WARN Call
    # to posix_fallocate failed : No space left on device", "misc/shmutils.cc:71 NCCL WARN
    # Error: failed to extend /dev/shm/nccl-fjwOOB to 5967876 bytes", "Call to shm_open
    # failed : Permission denied", the error unwinding "NCCL INFO transport/shm.cc:114 -> 2",
    # vLLM's "ncclShmOpen". The usual cause is a container's 64 MB /dev/shm: a local
    # resource fault on this node, so a root cause (``cause``), not another rank's echo.
    _rule(_FC.NCCL_ERROR, 12,
          r"posix_fallocate\s+failed|failed\s+to\s+extend\s+/dev/shm/|\bshm_open\s+failed|"
          r"\bncclShmOpen\b|nccl-shm-\S+|\bshm(?:utils)?\.(?:cc|h):\d+(?:\s+NCCL\s+WARN|\s*->\s*\d)",
          "posix_fallocate", "failed to extend", "shm_open", "ncclshmopen", "nccl-shm", "shm.h",
          "shm.cc", "shmutils.cc", cause=True),
    # When /dev/shm is too small, ftruncate succeeds and the first touch of the mapped
    # segment dies with SIGBUS instead: "Caught signal 7 (Bus error: nonexistent physical
    # address)" (UCX), "Signal: Bus error (7)" (Open MPI), torchrun's "exitcode: -7" /
    # "Signal 7 (SIGBUS) received by PID", srun's "task 3: Bus error". A bus error with
    # NCCL in the process is that; DataLoader workers' bus errors have their own rule.
    _rule(_FC.NCCL_ERROR, 8,
          r"^(?![^\n]*(?:DataLoader|encountered\s+in\s+worker))[^\n]*?"
          r"(?:\bSIGBUS\b|\bBus\s+error\b|\bsignal\s+7\b|exit\s*code\s*:?\s*-7\b)",
          "sigbus", "bus error", "signal 7", "exitcode", "exit code",
          requires=_NCCL_CONTEXT, cause=True),
    # proxy thread failures: "[Proxy Service 9] Failed to execute operation Connect from rank 9"
    _rule(_FC.NCCL_ERROR, 6, r"\[Proxy\s+\w+(?:\s+\d+)?\]\s+Failed", "proxy"),
    # bootstrap: "NCCL WARN Bootstrap : no socket interface found"
    _rule(_FC.NCCL_ERROR, 5, r"Bootstrap\s*:\s*no\s+socket\s+interface", "bootstrap"),
    # "ncclCommInitRank failed", "NCCL communicator was aborted on rank 3."
    _rule(_FC.NCCL_ERROR, 6, r"ncclCommInit\w*\s+failed", "ncclcomminit"),
    _rule(_FC.NCCL_ERROR, 3, r"NCCL\s+communicator\s+was\s+aborted", "aborted"),
    # gloo transport: "[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed
    # by peer [10.0.0.1]:8594" / "Connection reset by peer".
    _rule(_FC.NCCL_ERROR, 6,
          r"gloo/transport/\S+\]\s*(?:Connection\s+(?:closed|reset)\s+by\s+peer|Read\s+error|"
          r"Write\s+error)",
          "gloo"),
    # c10d wraps all backend failures in DistBackendError; on its own it only hints.
    _rule(_FC.NCCL_ERROR, 2, r"\bDistBackendError\b", "distbackenderror", hint=True),

    # ------------------------------------------------------------------ gpu_hardware
    # "RuntimeError: CUDA error: uncorrectable ECC error encountered", "Double Bit ECC Error",
    # "cudaErrorECCUncorrectable", NCCL "Cuda failure 'uncorrectable ECC error encountered'".
    _rule(_FC.GPU_HARDWARE, 12,
          r"uncorrectable\s+ECC\s+error|ECC_?UNCORRECTABLE|ErrorECCUncorrectable",
          "ecc"),
    _rule(_FC.GPU_HARDWARE, 9,
          r"\b(?:double[\s-]bit|multi[\s-]bit|fatal)\s+ECC\b|\bECC\s+errors?\s+(?:detected|"
          r"encountered|occurred)",
          "ecc"),
    # Xid 48 text: "An uncorrectable double bit error (DBE) has been detected on GPU"
    _rule(_FC.GPU_HARDWARE, 9, r"\(DBE\)|\bDBE\s+error", "dbe", case=True),
    # kernel log: "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus."
    _rule(_FC.GPU_HARDWARE, 10, r"NVRM:\s*Xid\b|\bXid\s*\(PCI:", "xid"),
    _rule(_FC.GPU_HARDWARE, 7, r"\bXid(?:\s+error)?\s*[:#]?\s*\d+", "xid"),
    _rule(_FC.GPU_HARDWARE, 12, r"fallen\s+off\s+(?:of\s+)?the\s+bus|fell\s+off\s+the\s+bus",
          "off the bus", "off of the bus", "fell off"),
    # nvidia-smi / NVML on a dead GPU: "Unable to determine the device handle for GPU
    # 0000:03:00.0: Unknown Error", "GPU is lost. Reboot the system to recover this GPU".
    _rule(_FC.GPU_HARDWARE, 10, r"Unable\s+to\s+determine\s+the\s+device\s+handle\s+for\s+GPU",
          "device handle"),
    _rule(_FC.GPU_HARDWARE, 12,
          r"\bGPU\s+(?:is|has\s+been)\s+lost\b|recover\s+this\s+GPU|GPU\s+requires\s+reset",
          "gpu is lost", "gpu has been lost", "recover this gpu", "requires reset"),
    # the driver's verdict after a fatal Xid: nvidia-smi -q "GPU Recovery Action : Reset"
    # (anything but None), Xid 154 "GPU recovery action changed from 0x0 (None) to 0x1
    # (GPU Reset Required)", "Reset Required : Yes", DCGM/NVML "GPU needs reset".
    _rule(_FC.GPU_HARDWARE, 10,
          r"Recovery\s+Action\s*:\s*(?!None\b|N/A\b)\w|recovery\s+action\s+changed\s+from|"
          r"Reset\s+Required\s*:\s*Yes|GPU\s+Reset\s+Required|GPU\s+needs?\s+(?:a\s+)?reset",
          "recovery action", "reset required", "needs reset", "needs a reset", "need reset"),
    _rule(_FC.GPU_HARDWARE, 10, r"RmInitAdapter\s+failed", "rminitadapter"),
    _rule(_FC.GPU_HARDWARE, 7, r"couldn't\s+communicate\s+with\s+the\s+NVIDIA\s+driver",
          "nvidia driver"),
    # "CUDA error: an uncorrectable NVLink error was detected during the execution",
    # fabric manager / DCGM "NVLink ... error".
    _rule(_FC.GPU_HARDWARE, 12, r"uncorrectable\s+NVLink\s+error", "nvlink"),
    _rule(_FC.GPU_HARDWARE, 6, r"\bNVLink\b.*\b(?:error|fatal|failure|down|inactive)\b", "nvlink"),
    # PCIe AER: "pcieport 0000:00:03.0: PCIe Bus Error: severity=Corrected, type=Data Link Layer"
    _rule(_FC.GPU_HARDWARE, 7, r"PCIe\s+Bus\s+Error", "pcie"),
    _rule(_FC.GPU_HARDWARE, 4,
          r"\bAER:\s*(?:Multiple\s+)?(?:Uncorrected|Corrected)\s+(?:\(\w+\)\s+)?error",
          "aer"),
    # memory retirement: "pending row remap", "Row Remapper ... failure", "retired pages"
    _rule(_FC.GPU_HARDWARE, 6, r"row[\s-]*remap\w*\s+(?:failure|pending)|pending\s+row\s+remap",
          "remap"),
    # "CUDA error: unspecified launch failure" is the classic Xid 13/43/79 companion.
    _rule(_FC.GPU_HARDWARE, 5, r"unspecified\s+launch\s+failure|cudaErrorLaunchFailure",
          "launch failure", "cudaerrorlaunchfailure"),
    # "CUDA error: unknown error" / "CUDA-capable device(s) is/are busy or unavailable" (and
    # the older "all CUDA-capable devices are busy or unavailable", cudaErrorDevicesUnavailable,
    # THC "cuda runtime error (46)"). Alone it may be a GPU in exclusive mode held by a stray
    # process, so it only supports...
    _rule(_FC.GPU_HARDWARE, 4,
          r"CUDA\s+error:\s+unknown\s+error|CUDA_ERROR_UNKNOWN|"
          r"(?:device\(s\)\s+is/are|devices\s+are)\s+busy\s+or\s+unavailable|"
          r"cudaErrorDevicesUnavailable|cuda\s+runtime\s+error\s+\(46\)",
          "cuda error", "cuda_error_unknown", "busy or unavailable", "cudaerrordevicesunavailable",
          "error (46)"),
    # ...but next to the kernel or NVML saying the GPU fell off the bus, is lost or needs a
    # reset, the device is busy because it is dead: the node must be drained.
    _rule(_FC.GPU_HARDWARE, 8,
          r"busy\s+or\s+unavailable|cudaErrorDevicesUnavailable|cuda\s+runtime\s+error\s+\(46\)|"
          r"CUDA_ERROR_UNKNOWN",
          "busy or unavailable", "cudaerrordevicesunavailable", "error (46)", "cuda_error_unknown",
          requires=_GPU_RESET_CONTEXT),
    # illegal memory access is usually a kernel bug (see user_code), sometimes an Xid 31.
    _rule(_FC.GPU_HARDWARE, 2, r"illegal\s+memory\s+access", "illegal memory", hint=True),

    # ------------------------------------------------------------------ oom_gpu
    # "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.39 GiB. GPU 1 has
    # a total capacity of 79.32 GiB ...", "RuntimeError: CUDA error: out of memory",
    # "torch.OutOfMemoryError", ROCm "HIP out of memory", XPU/MPS variants.
    _rule(_FC.OOM_GPU, 10,
          r"\b(?:CUDA|HIP|XPU|MPS\s+backend)(?:\s+error)?\s*:?\s*out\s+of\s+memory",
          "out of memory"),
    _rule(_FC.OOM_GPU, 10, r"\btorch\.(?:cuda\.)?OutOfMemoryError\b", "outofmemoryerror"),
    # NCCL's own allocation failing: "NCCL WARN Cuda failure 'out of memory'"
    _rule(_FC.OOM_GPU, 9, r"Cuda\s+failure\s+'?out\s+of\s+memory", "cuda failure"),
    _rule(_FC.OOM_GPU, 8, r"cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY",
          "cudaerrormemoryallocation", "cuda_error_out_of_memory"),
    _rule(_FC.OOM_GPU, 7, r"CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED", "alloc_failed"),
    # allocator detail lines: "Tried to allocate 564.00 MiB (GPU 2; 79.35 GiB total capacity;"
    _rule(_FC.OOM_GPU, 5, r"Tried\s+to\s+allocate\s+[\d.]+\s*[KMGT]iB", "tried to allocate"),
    _rule(_FC.OOM_GPU, 5, r"GPU\s+\d+\s+has\s+a\s+total\s+capac\w*\s+of", "total capac"),
    # TensorFlow: "OOM when allocating tensor with shape[...] ... on
    # /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc" (on device:CPU
    # it is host memory: see oom_host).
    _rule(_FC.OOM_GPU, 10, r"OOM\s+when\s+allocating\s+tensor(?!.*device:CPU)",
          "oom when allocating"),
    # XLA / JAX style device OOM: "RESOURCE_EXHAUSTED: Out of memory while trying to allocate"
    _rule(_FC.OOM_GPU, 6, r"RESOURCE_EXHAUSTED:\s*Out\s+of\s+memory", "resource_exhausted"),

    # ------------------------------------------------------------------ oom_host
    # kernel: "Out of memory: Killed process 12345 (python)", "Memory cgroup out of memory:
    # Killed process ...", "python invoked oom-killer", "oom-kill:constraint=...", "oom_reaper".
    _rule(_FC.OOM_HOST, 10,
          r"Out\s+of\s+memory:\s+Kill(?:ed)?\s+process|Memory\s+cgroup\s+out\s+of\s+memory",
          "out of memory"),
    _rule(_FC.OOM_HOST, 10, r"\boom[-_ ]?kill(?:er|ed|ing)?\b|\boom_reaper\b",
          "oom-kill", "oom_kill", "oom kill", "oomkill", "oom_reaper"),
    # Kubernetes container status "OOMKilled" (reason: OOMKilled, exit code 137).
    _rule(_FC.OOM_HOST, 10, r"\bOOMKilled\b", "oomkilled"),
    # Slurm: "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=191.batch cgroup",
    # "Job 123 exceeded memory limit (X > Y), being killed", "task 0: Out Of Memory".
    _rule(_FC.OOM_HOST, 10, r"exceeded\s+(?:job\s+|step\s+)?memory\s+limit", "exceeded"),
    _rule(_FC.OOM_HOST, 10, r"\btasks?\s+[\d,-]+:\s*Out\s+Of\s+Memory|\bOUT_OF_MEMORY\b",
          "out of memory", "out_of_memory"),
    # Ray: "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on
    # memory." / raylet "Workers (tasks / actors) killed due to memory pressure (OOM)".
    _rule(_FC.OOM_HOST, 10,
          r"running\s+low\s+on\s+memory|killed\s+due\s+to\s+memory\s+pressure|"
          r"ray\.exceptions\.OutOfMemoryError",
          "low on memory", "memory pressure", "ray.exceptions"),
    # ...and its detail, which survives when the first line was cut: "Memory on the node (IP:
    # 10.0.3.220, ID: ...) where the task ... was running was 59.49GB / 62.58GB (0.950744),
    # which exceeds the memory usage threshold of 0.95. Ray killed this worker ..."
    _rule(_FC.OOM_HOST, 10,
          r"Memory\s+on\s+the\s+node\s+\(IP:|exceeds\s+the\s+memory\s+usage\s+threshold|"
          r"Ray\s+killed\s+this\s+worker",
          "memory on the node", "memory usage threshold", "ray killed"),
    # userspace OOM daemons kill before the kernel does, and earlyoom sends SIGTERM first, so
    # without these lines the death reads as a preemption: "systemd-oomd[840]: Killed
    # /user.slice/... due to memory pressure for /user.slice/... being 51.07% > 50.00%",
    # "...scope: systemd-oomd killed 12 process(es) in this unit.", "earlyoom[845]: low
    # memory! at or below SIGTERM limits", "earlyoom[845]: sending SIGTERM to process 322603".
    _rule(_FC.OOM_HOST, 12,
          r"systemd-oomd\b.*\bKilled\b|\bsystemd-oomd\s+killed|due\s+to\s+memory\s+pressure\s+for|"
          r"\bearlyoom\b.*(?:low\s+memory|sending\s+SIG\w+\s+to\s+process)",
          "systemd-oomd", "memory pressure for", "earlyoom"),
    # CPU allocator: "[enforce fail at alloc_cpu.cpp:83] . DefaultCPUAllocator: can't allocate
    # memory: you tried to allocate 123 bytes. Error code 12 (Cannot allocate memory)", newer
    # builds: "DefaultCPUAllocator: not enough memory: you tried to allocate 34359738368 bytes."
    # ...and the older TH allocator: "RuntimeError: $ Torch: not enough memory: you tried to
    # allocate 0GB. Buy new RAM! at ..\aten\src\TH\THGeneral.cpp:204".
    _rule(_FC.OOM_HOST, 10,
          r"(?:DefaultCPUAllocator|Torch):\s*(?:can't\s+allocate|not\s+enough)\s+memory|"
          r"Buy\s+new\s+RAM",
          "defaultcpuallocator", "torch:", "new ram"),
    _rule(_FC.OOM_HOST, 6, r"Cannot\s+allocate\s+memory|std::bad_alloc|(?<![\w.])MemoryError\b",
          "allocate memory", "bad_alloc", "memoryerror"),
    # DataLoader workers: "DataLoader worker (pid 1234) is killed by signal: Killed." and the
    # /dev/shm variant "Unexpected bus error encountered in worker. This might be caused by
    # insufficient shared memory (shm)."
    _rule(_FC.OOM_HOST, 8, r"worker\s+\(pid\s+\d+\)\s+is\s+killed\s+by\s+signal:\s+Killed",
          "killed by signal"),
    _rule(_FC.OOM_HOST, 5,
          r"insufficient\s+shared\s+memory|bus\s+error\s+encountered\s+in\s+worker",
          "insufficient shared", "bus error"),
    # the same /dev/shm exhaustion seen by torch.multiprocessing when a worker hands a tensor
    # over: "RuntimeError: unable to write to file </torch_1234_567_0>: No space left on
    # device (28)", "unable to open shared memory object </torch_..>" (those files live in
    # /dev/shm, not on the checkpoint disk).
    _rule(_FC.OOM_HOST, 8,
          r"unable\s+to\s+(?:write\s+to\s+file|open\s+shared\s+memory\s+object)\s+</torch_",
          "</torch_"),
    # A bus error without NCCL around is most often that too (hint tier, like exit code -7).
    _rule(_FC.OOM_HOST, 2, r"\bSIGBUS\b|\bBus\s+error\b|Signal\s+7\s+\(SIGBUS\)",
          "sigbus", "bus error", hint=True),
    # Frameworks and schedulers that name host memory in their own words: loky/joblib
    # "... or by an excessive memory usage causing the Operating System to kill the
    # worker" (with "{SIGKILL(-9)}"), Slurm "killed by the cgroup out-of-memory handler",
    # LSF "TERM_MEMLIMIT", PBS "job killed: mem 42kb exceeded limit", YARN "Container
    # killed by YARN for exceeding memory limits", Dask "Worker exceeded 95% memory
    # budget", older Ray "RayOutOfMemoryError: More than 95% of the memory on node",
    # numpy "_ArrayMemoryError: Unable to allocate 3.2 GiB for an array", the JVM under
    # Spark "java.lang.OutOfMemoryError: Java heap space", TF "OOM when allocating tensor
    # ... device:CPU", notebooks "Your session crashed after using all available RAM".
    _rule(_FC.OOM_HOST, 10,
          r"cgroup\s+out-of-memory\s+handler|\bTERM_MEMLIMIT\b|\bmem\s+\S+\s+exceeded\s+limit|"
          r"exceeding\s+(?:physical\s+)?memory\s+limits?|exceeded\s+\d+%\s+memory\s+budget|"
          r"RayOutOfMemoryError|More\s+than\s+\d+%\s+of\s+the\s+memory\s+on\s+node|"
          r"_ArrayMemoryError|Unable\s+to\s+allocate\s+[\d.]+\s*[KMGTP]i?B\s+for\s+an\s+array|"
          r"OutOfMemoryError:\s*Java\s+heap|OOM\s+when\s+allocating\s+tensor.*device:CPU|"
          r"crashed\s+after\s+using\s+all\s+available\s+RAM|"
          r"allocate\s+more\s+memory\s+than\s+is\s+available",
          "out-of-memory handler", "term_memlimit", "exceeded limit", "exceeding", "memory budget",
          "rayoutofmemoryerror", "more than", "_arraymemoryerror", "for an array", "java heap",
          "oom when allocating", "all available ram", "more memory than"),
    _rule(_FC.OOM_HOST, 7,
          r"excessive\s+memory\s+usage\s+causing\s+the\s+Operating\s+System\s+to\s+kill",
          "excessive memory"),
    # Ray Tune's status warning before the kills: "Memory usage on this node: 7.4/7.5 GiB:
    # ***LOW MEMORY*** less than 10% of the memory on this node is available for use. This
    # can cause unexpected crashes." Supporting only: any explicit error outweighs it.
    _rule(_FC.OOM_HOST, 5,
          r"\*\*\*LOW\s+MEMORY\*\*\*|less\s+than\s+\d+%\s+of\s+the\s+memory\s+on\s+this\s+node",
          "low memory", "less than"),
    # Kubernetes eviction: "The node was low on resource: memory."
    _rule(_FC.OOM_HOST, 7, r"low\s+on\s+resource:\s*memory", "low on resource"),
    # --- circumstantial: the process got SIGKILL and nobody said why (hint tier) ---
    # torchrun: "failed (exitcode: -9) local_rank: 3 (pid: 812917)", "exitcode  : -9 (pid: ..)"
    _rule(_FC.OOM_HOST, 6, r"exit\s*code\s*:?\s*-9\b", "exitcode", "exit code", hint=True),
    # torchrun: "traceback : Signal 9 (SIGKILL) received by PID 14750"
    _rule(_FC.OOM_HOST, 6, r"Signal\s+9\s+\(SIGKILL\)", "sigkill", hint=True),
    # DeepSpeed launcher: "exits with return code = -9"; mp.spawn: "process 0 terminated with
    # signal SIGKILL"; subprocess: "died with <Signals.SIGKILL: 9>"; shells: "exit code 137".
    # Lightning: "Child process with PID 9487 terminated with code -9. Forcefully
    # terminating all other processes"; loky: "The exit codes of the workers are
    # {SIGKILL(-9)}"; mpirun: "exited on signal 9 (Killed)"; Horovod: "exit with status
    # code 137".
    _rule(_FC.OOM_HOST, 6,
          r"return\s+code\s*=\s*-9\b|terminated\s+with\s+signal\s+SIGKILL|Signals\.SIGKILL|"
          r"exit(?:ed)?\s+(?:with\s+)?(?:code|status)\s*:?\s*137\b|status\s+code\s*:?\s*137\b|"
          r"terminated\s+with\s+code\s+-9\b|SIGKILL\(-9\)|exited\s+on\s+signal\s+9\b",
          "return code", "sigkill", "exit code", "exit status", "exited with", "status code",
          "with code", "signal 9", hint=True),
    # Pools whose workers died without a word, most often to the OOM killer: HF datasets
    # "One of the subprocesses has abruptly died during map operation", concurrent.futures
    # "A process in the process pool was terminated abruptly", the DataLoader's "DataLoader
    # worker (pid(s) 1234) exited unexpectedly".
    _rule(_FC.OOM_HOST, 4,
          r"subprocesses\s+has\s+abruptly\s+died|process\s+pool\s+was\s+terminated\s+abruptly|"
          r"DataLoader\s+worker\s+\(pid\(s\)\s+[\d, ]+\)\s+exited\s+unexpectedly",
          "abruptly", "exited unexpectedly", hint=True),
    # bash / Slurm: a bare "Killed" line, "line 28:  8156 Killed   python3 main.py",
    # "srun: error: node1: task 0: Killed".
    _rule(_FC.OOM_HOST, 5, r"^\s*(?:\S+:\s+line\s+\d+:\s+\d+\s+)?Killed\b|task\s+\d+:\s*Killed\b",
          "killed", hint=True),

    # ------------------------------------------------------------------ user_code
    # imports: "ModuleNotFoundError: No module named 'x'", "ImportError: cannot import name
    # 'LRScheduler' from ...", "undefined symbol: _ZN3c10..." (ABI mismatch of an extension).
    _rule(_FC.USER_CODE, 8, r"\bModuleNotFoundError\b|No\s+module\s+named",
          "modulenotfounderror", "no module named"),
    _rule(_FC.USER_CODE, 7, r"\bImportError\b|cannot\s+import\s+name",
          "importerror", "cannot import name"),
    _rule(_FC.USER_CODE, 6, r"undefined\s+symbol:", "undefined symbol"),
    # launch config: "ValueError: Error initializing torch.distributed using env:// rendezvous:
    # environment variable MASTER_ADDR expected, but not set"
    _rule(_FC.USER_CODE, 7, r"environment\s+variable\s+\w+\s+expected,\s+but\s+not\s+set",
          "expected, but not set"),
    _rule(_FC.USER_CODE, 4, r"Failed\s+to\s+import\s+\S+\s+because", "failed to import"),
    # plain Python bugs, as the final line of a traceback ("KeyError: 'input_ids'").
    _rule(_FC.USER_CODE, 8, r"\b(?:SyntaxError|IndentationError|NameError|UnboundLocalError)\b\s*:",
          "syntaxerror", "indentationerror", "nameerror", "unboundlocalerror"),
    _rule(_FC.USER_CODE, 6,
          r"\b(?:TypeError|KeyError|AttributeError|IndexError|NotImplementedError|"
          r"ZeroDivisionError)\b(?:\s*:|\s*$)",
          "typeerror", "keyerror", "attributeerror", "indexerror", "notimplementederror",
          "zerodivisionerror"),
    _rule(_FC.USER_CODE, 5, r"\b(?:ValueError|AssertionError|RecursionError)\b(?:\s*:|\s*$)",
          "valueerror", "assertionerror", "recursionerror"),
    # wrong paths (data, configs, pretrained weights): "FileNotFoundError: [Errno 2] No such
    # file or directory: 'data/x.json'", HF "... is not a local folder and is not a valid model
    # identifier", "does not appear to have a file named".
    _rule(_FC.USER_CODE, 6, r"\bFileNotFoundError\b|\bIsADirectoryError\b|\bNotADirectoryError\b",
          "filenotfounderror", "isadirectoryerror", "notadirectoryerror"),
    _rule(_FC.USER_CODE, 3, r"No\s+such\s+file\s+or\s+directory", "no such file"),
    _rule(_FC.USER_CODE, 7,
          r"is\s+not\s+a\s+valid\s+model\s+identifier|"
          r"does\s+not\s+appear\s+to\s+have\s+a\s+file\s+named|\bHFValidationError\b|"
          r"Can't\s+load\s+(?:tokenizer|config|the\s+model)",
          "model identifier", "appear to have", "hfvalidationerror", "can't load"),
    # CLI: argparse "train.py: error: unrecognized arguments: --local-rank=1",
    # "error: the following arguments are required: --cfg", "error: argument --lr: invalid".
    _rule(_FC.USER_CODE, 9,
          r"error:\s+(?:unrecognized\s+arguments|the\s+following\s+arguments\s+are\s+required|"
          r"argument\s+\S+:\s+(?:invalid|expected))",
          "unrecognized arguments", "arguments are required", "error: argument"),
    # checkpoint/model structure mismatch: "Error(s) in loading state_dict for Net:",
    # "size mismatch for fc.weight: copying a param with shape ...", "Missing key(s) in
    # state_dict", "Unexpected key(s) in state_dict".
    _rule(_FC.USER_CODE, 8,
          r"size\s+mismatch\s+for\s+\S+|Error\(s\)\s+in\s+loading\s+state_dict|(?:Missing|"
          r"Unexpected)\s+key\(s\)\s+in\s+state_dict",
          "mismatch", "state_dict"),
    # shapes, dtypes, devices and autograd misuse.
    _rule(_FC.USER_CODE, 8,
          r"mat1\s+and\s+mat2\s+shapes\s+cannot\s+be\s+multiplied|"
          r"size\s+of\s+tensor\s+a\s+\(\d+\)\s+must\s+match|"
          r"shape\s+'\[[^\]]*\]'\s+is\s+invalid\s+for\s+input\s+of\s+size|"
          r"Given\s+groups=\d+,\s+weight\s+of\s+size",
          "shapes cannot", "must match", "is invalid for input", "given groups"),
    _rule(_FC.USER_CODE, 8,
          r"Expected\s+all\s+tensors\s+to\s+be\s+on\s+the\s+same\s+device|"
          r"expected\s+scalar\s+type\s+\w+\s+but\s+found|"
          r"Input\s+type\s+\(.*\)\s+and\s+weight\s+type",
          "same device", "scalar type", "weight type"),
    _rule(_FC.USER_CODE, 8,
          r"does\s+not\s+require\s+grad\s+and\s+does\s+not\s+have\s+a\s+grad_fn|"
          r"modified\s+by\s+an\s+inplace\s+operation|"
          r"backward\s+through\s+the\s+graph\s+a\s+second\s+time",
          "grad_fn", "inplace", "second time"),
    # DDP / c10d misuse: "Expected to have finished reduction in the prior iteration before
    # starting a new one", "Expected to mark a variable ready only once", "Default process
    # group has not been initialized", TORCH_DISTRIBUTED_DEBUG "Detected mismatch between
    # collectives on ranks", NCCL "Duplicate GPU detected : rank 1 and rank 0 both on CUDA
    # device 1d000" (no set_device), DDP param shape checks, "DistributedDataParallel is not
    # needed when a module doesn't have any parameter that requires a gradient".
    _rule(_FC.USER_CODE, 9,
          r"Expected\s+to\s+have\s+finished\s+reduction|"
          r"Expected\s+to\s+mark\s+a\s+variable\s+ready\s+only\s+once|"
          r"parameters\s+that\s+were\s+not\s+used\s+in\s+producing\s+(?:the\s+)?loss",
          "finished reduction", "ready only once", "not used in producing"),
    _rule(_FC.USER_CODE, 8,
          r"Default\s+process\s+group\s+has\s+not\s+been\s+initialized|"
          r"Detected\s+mismatch\s+between\s+collectives|"
          r"appears\s+not\s+to\s+match\s+sizes\s+of\s+the\s+same\s+param|"
          r"DistributedDataParallel\s+is\s+not\s+needed\s+when",
          "default process group", "mismatch between collectives", "appears not to match",
          "is not needed when"),
    _rule(_FC.USER_CODE, 12, r"Duplicate\s+GPU\s+detected", "duplicate gpu"),
    # device-side asserts (index out of range in embedding / loss), bad device ordinals,
    # binaries built for another GPU arch.
    _rule(_FC.USER_CODE, 8,
          r"device-side\s+assert\s+triggered|invalid\s+device\s+ordinal|"
          r"no\s+kernel\s+image\s+is\s+available",
          "device-side assert", "device ordinal", "kernel image"),
    _rule(_FC.USER_CODE, 4, r"illegal\s+memory\s+access|misaligned\s+address",
          "illegal memory", "misaligned"),
    # a Python traceback / "exitcode: 1" on their own say little (hint tier).
    _rule(_FC.USER_CODE, 1.5, r"Traceback\s+\(most\s+recent\s+call\s+last\)",
          "traceback", hint=True),
    _rule(_FC.USER_CODE, 1, r"exit\s*code\s*:?\s*1\b|return\s+code\s*=\s*1\b",
          "exitcode", "exit code", "return code", hint=True),
    # Fallbacks (hint tier): a traceback ending in an exception type that is not one of the
    # infrastructure ones ("json.decoder.JSONDecodeError: Expecting value"), or a bare
    # "RuntimeError: <message>" that no rule above recognised, is most likely a bug.
    _rule(_FC.USER_CODE, 3,
          r"^\s*(?:\[rank\d+\]:\s*)?(?:\w+\.)*"
          r"(?!(?:Runtime|OS|IO|Environment|Connection\w*|BrokenPipe|EOF|Timeout|Memory|"
          r"OutOfMemory|FloatingPoint|ChildFailed|CalledProcess|Dist\w*|Ray\w*|ActorDied|"
          r"Rendezvous\w*|Unpickling|Safetensor|Signal|ProcessExited|Checkpoint|Blocking|"
          r"Interrupted)(?:Error|Exception)\b)[A-Z]\w*(?:Error|Exception)\s*:",
          "error:", "exception:", hint=True, case=True),
    _rule(_FC.USER_CODE, 2, r"^\s*(?:\[rank\d+\]:\s*)?RuntimeError:", "runtimeerror:",
          hint=True, case=True),

    # ------------------------------------------------------------------ rendezvous
    # TCPStore / c10d socket: "The server socket has failed to bind to [::]:29500 (errno: 98 -
    # Address already in use)", "EADDRINUSE".
    _rule(_FC.RENDEZVOUS, 10, r"Address\s+already\s+in\s+use|\bEADDRINUSE\b",
          "already in use", "eaddrinuse"),
    _rule(_FC.RENDEZVOUS, 8, r"server\s+socket\s+has\s+failed\s+to\s+(?:listen|bind)",
          "server socket"),
    # client side: "[c10d] The client socket has timed out after 60s while trying to connect to
    # (host, 29500).", "The client socket has failed to connect to any network address of
    # (host, 29500)", old "RuntimeError: connect() timed out."
    _rule(_FC.RENDEZVOUS, 9, r"client\s+socket\s+has\s+(?:timed\s+out|failed\s+to\s+connect)",
          "client socket"),
    _rule(_FC.RENDEZVOUS, 8, r"connect\(\)\s+timed\s+out", "connect()"),
    # The master / store host name does not resolve (a typo, or on Kubernetes a headless
    # Service whose DNS record is not there yet). TCPStore: "ValueError: host not found: Name
    # or service not known"; gloo: "Unable to find address for: dgx-1.ai"; c10d (torch >= 1.11)
    # "The IPv4 network addresses of (host, 29500) cannot be retrieved (gai error: -2 - Name or
    # service not known)". Its IPv6 twin is printed on every lookup that has no AAAA record,
    # harmless when IPv4 works, so it is only a hint.
    _rule(_FC.RENDEZVOUS, 10,
          r"host\s+not\s+found:\s*(?:Name\s+or\s+service|Temporary\s+failure|No\s+address|"
          r"nodename\s+nor)|Unable\s+to\s+find\s+address\s+for",
          "host not found", "unable to find address"),
    _rule(_FC.RENDEZVOUS, 10, r"IPv4\s+network\s+addresses\s+of\s+.*cannot\s+be\s+retrieved",
          "ipv4 network"),
    _rule(_FC.RENDEZVOUS, 2, r"IPv6\s+network\s+addresses\s+of\s+.*cannot\s+be\s+retrieved",
          "ipv6 network", hint=True),
    # c10d cannot resolve this host's own name ("[c10d] The hostname of the client socket
    # cannot be retrieved. err=-3", a resolver EAI_AGAIN): often all a hung init prints.
    # Supporting only: any explicit error outweighs it.
    _rule(_FC.RENDEZVOUS, 4, r"hostname\s+of\s+the\s+client\s+socket\s+cannot\s+be\s+retrieved",
          "client socket cannot"),
    # any other failed lookup ("socket.gaierror: [Errno -3] Temporary failure in name
    # resolution", "getaddrinfo failed", "failed to resolve") in a torch.distributed job,
    # except the IPv6 warning above and lookups of web hosts (model or dataset downloads).
    # Weighted above a Python exception and the launcher's exit summaries: an elastic agent
    # restarting its workers around it (restart notices, ChildFailedError, exit codes)
    # only repeats the failure. c10d's "(gai error: ...)" lines have the rules above.
    _rule(_FC.RENDEZVOUS, 9,
          r"^(?![^\n]*(?:IPv6\s+network|gai\s+error|https?://|huggingface|HTTPS?Connection|"
          r"urllib3|wandb|requests\.exceptions|Max\s+retries))[^\n]*?"
          r"(?:Name\s+or\s+service\s+not\s+known|Temporary\s+failure\s+in\s+name\s+resolution|"
          r"nodename\s+nor\s+servname|getaddrinfo\s+failed|failed\s+to\s+resolve|"
          r"Could\s+not\s+resolve\s+host(?:name)?|No\s+address\s+associated\s+with\s+hostname)",
          "name or service", "name resolution", "servname", "getaddrinfo", "failed to resolve",
          "could not resolve", "no address associated",
          requires=_DISTRIBUTED_CONTEXT),
    _rule(_FC.RENDEZVOUS, 7,
          r"errno:\s*(?:111|113|110)\s*-\s*(?:Connection\s+refused|No\s+route\s+to\s+host|"
          r"Connection\s+timed\s+out)",
          "errno"),
    # Launchers that start the other nodes over ssh (DeepSpeed's runner, pdsh, mpirun) fail
    # to reach one: "Using hostfile at /job/hostfile but host=node-1 was not reachable via
    # ssh", "pdsh@node-0: node-1: ssh exited with exit code 255", "ssh: connect to host
    # node-1 port 22: No route to host", "Command 'ssh ... node-1 hostname' returned
    # non-zero exit status 255".
    _rule(_FC.RENDEZVOUS, 9,
          r"not\s+reachable\s+via\s+ssh|ssh\s+exited\s+with\s+exit\s+code\s+255|"
          r"ssh:\s+connect\s+to\s+host\s+\S+\s+port\s+\d+:\s+(?:Connection\s+refused|"
          r"No\s+route\s+to\s+host|Connection\s+timed\s+out)|"
          r"'ssh\b[^'\n]*'\]?'?\s+returned\s+non-zero\s+exit\s+status\s+255",
          "via ssh", "exit code 255", "connect to host", "exit status 255"),
    # torchrun elastic: "RendezvousTimeoutError", "RendezvousConnectionError: The connection to
    # the C10d store has failed.", "RendezvousClosedError".
    _rule(_FC.RENDEZVOUS, 10, r"Rendezvous(?:Timeout|Connection|Closed|State)?Error", "rendezvous"),
    _rule(_FC.RENDEZVOUS, 8, r"connection\s+to\s+the\s+C10d\s+store\s+has\s+failed", "c10d store"),
    # store-based init barrier: "Waiting in store based barrier to initialize process group for
    # rank: 0, key: store_based_barrier_key:1 (world_size=4, worker_count=16, timeout=0:01:00)",
    # "Timed out initializing process group in store based barrier on rank: 7".
    _rule(_FC.RENDEZVOUS, 8, r"store\s+based\s+barrier", "store based barrier"),
    # TCPStore server waiting for workers: "DistStoreError: Timed out after 901 seconds waiting
    # for clients. 1/2 clients joined."
    _rule(_FC.RENDEZVOUS, 10, r"waiting\s+for\s+clients|\d+/\d+\s+clients\s+joined",
          "waiting for clients", "clients joined"),
    _rule(_FC.RENDEZVOUS, 6, r"\bDist(?:Store|Network)Error\b",
          "diststoreerror", "distnetworkerror"),
    # NCCL communicator bootstrap through the store: "[1] is setting up NCCL communicator and
    # retrieving ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0')
    # got error: Socket Timeout" (older builds spell it "retreiving").
    _rule(_FC.RENDEZVOUS, 9,
          r"ncclUniqueId\s+from\s+\[\d+\]\s+via\s+c10d|store->get\(.*\)\s+got\s+(?:error|"
          r"exception)",
          "nccluniqueid", "store->get"),
    _rule(_FC.RENDEZVOUS, 6,
          r"Timeout\s+waiting\s+for\s+key|wait\s+timeout\s+after\s+\d+\s*ms,?\s+keys",
          "waiting for key", "wait timeout"),
    _rule(_FC.RENDEZVOUS, 4, r"\bSocket\s+Timeout\b", "socket timeout"),
    # traceback frames inside process-group creation (hint tier).
    _rule(_FC.RENDEZVOUS, 2,
          r"in\s+(?:init_process_group|_store_based_barrier|_create_c10d_store|"
          r"_env_rendezvous_handler|next_rendezvous)\b",
          "init_process_group", "_store_based_barrier", "_create_c10d_store",
          "_env_rendezvous_handler", "next_rendezvous", hint=True),

    # ------------------------------------------------------------------ storage
    # "OSError: [Errno 28] No space left on device", "[Errno 122] Disk quota exceeded"
    # Not on lines about shared memory (/dev/shm for NCCL or DataLoader workers): that is
    # RAM, and has its own rules above.
    _rule(_FC.STORAGE, 10,
          r"^(?![^\n]*(?:shm|nccl|posix_fallocate|</torch_))[^\n]*?"
          r"(?:No\s+space\s+left\s+on\s+device|\[Errno\s+28\]|Disk\s+quota\s+exceeded|"
          r"\[Errno\s+122\])",
          "no space", "errno 28", "quota", "errno 122"),
    # "RuntimeError: write(): fd 29 failed with Input/output error", "[Errno 5] Input/output error"
    _rule(_FC.STORAGE, 9, r"Input/output\s+error|\[Errno\s+5\]", "input/output", "errno 5"),
    # "Stale file handle", "Read-only file system", FUSE "Transport endpoint is not connected"
    _rule(_FC.STORAGE, 8,
          r"Stale\s+file\s+handle|Read-only\s+file\s+system|"
          r"Transport\s+endpoint\s+is\s+not\s+connected",
          "stale file", "read-only file", "transport endpoint"),
    # torch.save / torch.load zip container: "[enforce fail at inline_container.cc:445] .
    # PytorchStreamWriter failed writing file data/176: file write failed",
    # "PytorchStreamReader failed reading zip archive: failed finding central directory",
    # "PytorchStreamReader failed reading file data/3: invalid header or archive is corrupted".
    _rule(_FC.STORAGE, 10, r"PytorchStream(?:Writer|Reader)\s+failed", "pytorchstream"),
    _rule(_FC.STORAGE, 8,
          r"file\s+write\s+failed|failed\s+finding\s+central\s+directory|archive\s+is\s+corrupted",
          "write failed", "central directory", "corrupted"),
    # torch.save closing the zip when the data did not all reach the disk (full or over
    # quota): "[enforce fail at inline_container.cc:337] . unexpected pos 11347827264 vs
    # 11347827160" from write_end_of_file; a checkpoint cut short: "zipfile.BadZipFile: File
    # is not a zip file", "PytorchStreamWriter failed writ..." truncated by the log itself.
    _rule(_FC.STORAGE, 9, r"unexpected\s+pos\s+\d+\s+vs\s+\d+", "unexpected pos"),
    _rule(_FC.STORAGE, 7, r"\bBadZipFile\b|File\s+is\s+not\s+a\s+zip\s+file",
          "badzipfile", "not a zip file"),
    # truncated files: "unexpected EOF, expected 123 more bytes. The file might be corrupted.",
    # "_pickle.UnpicklingError: invalid load key, '\x00'.", "EOFError: Ran out of input",
    # safetensors "Error while deserializing header: MetadataIncompleteBuffer".
    _rule(_FC.STORAGE, 9,
          r"unexpected\s+EOF,\s+expected\s+\d+\s+more\s+bytes|file\s+might\s+be\s+corrupted",
          "unexpected eof", "might be corrupted"),
    _rule(_FC.STORAGE, 7, r"UnpicklingError|invalid\s+load\s+key", "unpicklingerror", "load key"),
    # torch's legacy reader on a damaged file: "RuntimeError: Invalid magic number; corrupt
    # file?", "RuntimeError: storage has wrong size: expected 0 got 512" (a file cut short).
    _rule(_FC.STORAGE, 9, r"Invalid\s+magic\s+number|storage\s+has\s+wrong\s+size",
          "magic number", "wrong size"),
    _rule(_FC.STORAGE, 5, r"EOFError:\s*Ran\s+out\s+of\s+input", "ran out of input"),
    _rule(_FC.STORAGE, 8, r"MetadataIncompleteBuffer|HeaderTooLarge|SafetensorError",
          "metadataincompletebuffer", "headertoolarge", "safetensorerror"),
    # transformers on a corrupt weights file: "OSError: Unable to load weights from pytorch
    # checkpoint file for '/ckpt/pytorch_model.bin' at ..."
    _rule(_FC.STORAGE, 7, r"Unable\s+to\s+load\s+weights\s+from\s+pytorch\s+checkpoint",
          "unable to load weights"),
    # A load whose traceback was cut before its last line: a frame that only runs while
    # the file is opened as an archive means the archive is what failed (a missing file
    # fails earlier, in _open_file). torch.load's zip reader ("with
    # _open_zipfile_reader(opened_file)", "torch._C.PyTorchFileReader(name_or_buffer)"),
    # its legacy path reading the pickle's magic number, zipfile reading the central
    # directory ("in _RealGetContents").
    _rule(_FC.STORAGE, 8,
          r"with\s+_open_zipfile_reader\(|PyTorchFileReader\(|"
          r"magic_number\s*=\s*pickle_module\.load\(|in\s+_RealGetContents\b",
          "_open_zipfile_reader", "pytorchfilereader", "magic_number", "_realgetcontents"),
    # ...and torch.save's writer failing to create the file ("torch._C.PyTorchFileWriter(
    # str(name))" then "RuntimeError: File ckpt/checkpoint_0.pt cannot be opened."): a full
    # or read-only disk, or a checkpoint directory that is not there (not mounted).
    _rule(_FC.STORAGE, 7,
          r"PyTorchFileWriter\(|_open_zipfile_writer\(|^\s*RuntimeError:\s+File\s+\S+\s+cannot\s+be\s+opened",
          "pytorchfilewriter", "_open_zipfile_writer", "cannot be opened"),
    # torch.distributed.checkpoint wraps per-rank write failures in CheckpointException.
    _rule(_FC.STORAGE, 4, r"\bCheckpointException\b", "checkpointexception"),
    # a traceback that stops inside a checkpoint load, its message cut off or never
    # printed (DeepSpeed's load_checkpoint / _load_zero_checkpoint, HF's
    # deepspeed_load_checkpoint, Accelerate's load_state, a script's reload_checkpoint):
    # reading the checkpoint is what failed, most likely (hint tier: any message wins).
    _rule(_FC.STORAGE, 3,
          r"\bin\s+\w*(?:load_checkpoint|load_zero_checkpoint|load_state|load_accelerator_state|"
          r"resume_from_checkpoint|load_from_checkpoint)\b",
          "load_checkpoint", "load_zero_checkpoint", "load_state", "load_accelerator_state",
          "resume_from_checkpoint", "load_from_checkpoint", hint=True),
    # traceback frames inside (de)serialisation (hint tier).
    _rule(_FC.STORAGE, 2,
          r"serialization\.py\",\s+line\s+\d+,\s+in\s+(?:save|_save|load|_load)\b|"
          r"in\s+(?:save_checkpoint|_save_checkpoint|write_record)\b",
          "serialization.py", "save_checkpoint", "write_record", hint=True),

    # ------------------------------------------------------------------ preempted
    # Slurm: "slurmstepd: error: *** STEP 55595933.0 ON node-1 CANCELLED AT 2025-01-10T15:27:25
    # DUE TO TIME LIMIT ***", "... DUE TO PREEMPTION ***", "... DUE TO JOB REQUEUE ***".
    _rule(_FC.PREEMPTED, 12, r"DUE\s+TO\s+(?:TIME\s+LIMIT|PREEMPTION|JOB\s+REQUEUE)", "due to"),
    # a plain "scancel": "*** JOB 123 ON node CANCELLED AT 2024-01-01T00:00:00 ***"
    _rule(_FC.PREEMPTED, 6, r"\bCANCELLED\s+AT\s+\S+\s+\*\*\*", "cancelled", case=True),
    _rule(_FC.PREEMPTED, 5, r"DUE\s+TO\s+JOB\s+NOT\s+ENDING\s+WITH\s+SIGNALS", "not ending"),
    # torchrun agent: "Received 15 death signal, shutting down workers" (1 = SIGHUP, 2 = SIGINT;
    # older builds print "Received Signals.SIGTERM death signal").
    _rule(_FC.PREEMPTED, 10, r"Received\s+\S+\s+death\s+signal", "death signal"),
    # "torch.distributed.elastic.multiprocessing.api.SignalException: Process 76 got signal: 15"
    _rule(_FC.PREEMPTED, 9, r"got\s+signal:\s*(?:15|1|2|SIGTERM|SIGHUP|SIGINT)\b", "got signal"),
    # torchrun summary: "traceback : Signal 15 (SIGTERM) received by PID 1234"
    _rule(_FC.PREEMPTED, 8, r"Signal\s+(?:15|1|2)\s+\(SIG(?:TERM|HUP|INT)\)\s+received",
          "received by"),
    # the agent forwarding a hang-up / interrupt it received ("Sending process 123 closing
    # signal SIGHUP"); SIGTERM here is just the agent's normal cleanup, so it is not a rule.
    _rule(_FC.PREEMPTED, 6, r"closing\s+signal\s+SIG(?:HUP|INT)\b", "closing signal"),
    # Lightning: "[rank: 0] Received SIGTERM: 15", "Handling auto-requeue signal: 10",
    # "Requeued SLURM job: 123"; submitit: "Caught signal SIGUSR2 on host: this job is
    # preempted.", "... this job is timed-out.", "Bypassing signal SIGTERM".
    _rule(_FC.PREEMPTED, 8,
          r"Received\s+SIG(?:TERM|HUP|INT|USR1|USR2)\b|SIGTERM\s+received|"
          r"Caught\s+signal\s+SIG(?:TERM|USR1|USR2|HUP)\b",
          "received sig", "sigterm received", "caught signal"),
    _rule(_FC.PREEMPTED, 10, r"this\s+job\s+is\s+(?:preempted|timed[\s-]out)", "this job is"),
    _rule(_FC.PREEMPTED, 8, r"auto-requeue\s+signal|Requeu(?:e|ed|ing)\s+(?:SLURM\s+)?job",
          "requeu"),
    _rule(_FC.PREEMPTED, 5, r"Bypassing\s+(?:signal\s+)?SIGTERM", "bypassing"),
    # Clouds tell the VM before they take it, often only in the host's log, while the ranks
    # just die (SIGKILL, exit -9): GCP's metadata "termination is imminent" / "preempted:
    # TRUE", EC2's spot "instance-action" / "Spot ITN" (aws-node-termination-handler) /
    # "interrupted in 2 minutes", Azure's scheduled event "EventType": "Preempt", the
    # kubelet's "Pod was terminated in response to imminent node shutdown", GCE's ACPI
    # "G2 soft off". A notice outweighs the exit codes that follow it.
    _rule(_FC.PREEMPTED, 12,
          r"termination\s+is\s+imminent|spot/instance-action|instance-action\W+\S*?"
          r"(?:terminate|stop|hibernate)|\bSPOT_ITN\b|\bSpot\s+ITN\b|"
          r"interrupted\s+in\s+\d+\s+(?:minutes?|seconds?)|EventType\W{0,4}Preempt\b|"
          r"imminent\s+node\s+shutdown|ACPI\s+G2\s+soft\s+off|"
          r"(?:instance|vm|node)\s+(?:was|has\s+been|is\s+being)\s+preempted",
          "imminent", "instance-action", "spot_itn", "spot itn", "interrupted in", "preempt",
          "g2 soft off"),
    # The VM's shutdown as the host logs it: logind's "Power key pressed." (the ACPI power
    # button a cloud presses to stop or preempt a VM), the kubelet's graceful node shutdown.
    _rule(_FC.PREEMPTED, 8,
          r"Power\s+key\s+pressed|Shutdown\s+manager\s+detected\s+new\s+shutdown\s+event|"
          r"polling\s+for\s+termination-time",
          "power key", "shutdown manager", "termination-time"),
    # clouds / k8s: "Spot Instance interruption notice", "instance was preempted", "pod preempted"
    _rule(_FC.PREEMPTED, 7,
          r"\bpreempted\b|\bpreemption\s+(?:notice|signal)\b|"
          r"spot\s+(?:instance\s+)?(?:interruption|termination)",
          "preempt", "spot"),
    # Ctrl-C or an operator stopping the run.
    _rule(_FC.PREEMPTED, 5, r"^\s*KeyboardInterrupt\b|\bKeyboardInterrupt\s*$",
          "keyboardinterrupt"),
    # --- circumstantial (hint tier) ---
    _rule(_FC.PREEMPTED, 5,
          r"exit\s*code\s*:?\s*-(?:15|1)\b|return\s+code\s*=\s*-15\b|"
          r"exit(?:ed)?\s+(?:with\s+)?(?:code|status)\s*:?\s*143\b",
          "exitcode", "exit code", "return code", "exit status", "exited with", hint=True),
    _rule(_FC.PREEMPTED, 4,
          r"^\s*(?:\S+:\s+line\s+\d+:\s+\d+\s+)?(?:Terminated|Hangup)(?:\s{2,}\S.*)?\s*$",
          "terminated", "hangup", hint=True, case=True),
    _rule(_FC.PREEMPTED, 2, r"srun:\s+forcing\s+job\s+termination|srun:\s+got\s+SIGCONT",
          "srun:", hint=True),

    # ------------------------------------------------------------------ numerical
    # detectron2: "FloatingPointError: Loss became infinite or NaN at iteration=137!";
    # generic "loss is nan", "Loss is NaN, stopping training", "loss became nan".
    _rule(_FC.NUMERICAL, 10,
          r"\bloss\b[^\n]{0,60}?\b(?:is|became|was|has\s+become|becomes|"
          r"went)\s+(?:infinite\s+or\s+)?(?:nan|inf|infinite|non-finite)\b",
          "nan", "infinite", "non-finite", "is inf", "became inf", "was inf"),
    _rule(_FC.NUMERICAL, 8, r"\bFloatingPointError\b", "floatingpointerror"),
    _rule(_FC.NUMERICAL, 9,
          r"\bnan\s+(?:loss|gradients?|grad\s+norm|values?)\s+(?:detected|encountered|found)|"
          r"(?:detected|encountered|found)\s+(?:a\s+)?nan\b|contains\s+nan\b",
          "nan"),
    _rule(_FC.NUMERICAL, 8,
          r"\binf\s+(?:loss|gradients?|grad\s+norm)\s+(?:detected|encountered|found)|(?:detected|"
          r"encountered|found)\s+(?:an\s+)?inf\b|\binf\s+or\s+nan\b|\bnan\s+or\s+inf\b",
          "inf loss", "inf grad", "detected inf", "encountered inf", "found inf", "inf or nan",
          "nan or inf"),
    _rule(_FC.NUMERICAL, 8,
          r"non-finite\s+(?:loss|gradients?|values?)|"
          r"is\s+non-finite,\s+so\s+it\s+cannot\s+be\s+clipped",
          "non-finite"),
    # anomaly mode: "Function 'LogSoftmaxBackward0' returned nan values in its 0th output."
    _rule(_FC.NUMERICAL, 9, r"returned\s+nan\s+values\s+in\s+its", "returned nan"),
    # Megatron: "Rank 13: found NaN in local grad norm in backward pass before data-parallel
    # communication collective", rerun machine "Unexpected result nan".
    _rule(_FC.NUMERICAL, 10, r"found\s+(?:NaN|Inf)\s+in\s+(?:local\s+)?grad",
          "found nan", "found inf"),
    _rule(_FC.NUMERICAL, 8, r"Unexpected\s+result\s+(?:nan|inf)", "unexpected result"),
    _rule(_FC.NUMERICAL, 6, r"number\s+of\s+nan\s+iterations:\s*[1-9]", "nan iterations"),
    # logged metrics: "{'loss': nan, ...}", "loss=nan", "grad_norm: nan", "lm loss: NaN".
    _rule(_FC.NUMERICAL, 7,
          r"\b(?:loss|train_loss|lm\s+loss|grad_norm|grad\s+norm|"
          r"gnorm)['\"]?\s*[:=]\s*['\"]?[-+]?(?:nan|inf)\b",
          "nan", ": inf", "=inf", "= inf", ": -inf", "=-inf"),
    # fp16 loss scaling. DeepSpeed: "Current loss scale already at minimum - cannot decrease scale
    # anymore. Exiting run."; fairseq: "Minimum loss scale reached (0.0001)".
    _rule(_FC.NUMERICAL, 12,
          r"loss\s+scale\s+already\s+at\s+minimum|Minimum\s+loss\s+scale\s+reached",
          "minimum"),
    # ...and the run-up to it, which only matters when it keeps happening: DeepSpeed "[deepspeed]
    # OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 64, reducing to 32", apex "Gradient
    # overflow.  Skipping step, loss scaler 0 reducing loss scale to 0.5", fairseq "WARNING:
    # overflow detected, setting loss scale to: 0.25".
    _rule(_FC.NUMERICAL, 5,
          r"OVERFLOW!\s+Rank\s+\d+\s+Skipping\s+step|Gradient\s+overflow\.\s+Skipping\s+step|"
          r"overflow\s+detected,\s+setting\s+loss\s+scale",
          "overflow", min_count=3),
    # a dynamic loss scale pushed below 1.0 means gradients overflow even at tiny scales.
    _rule(_FC.NUMERICAL, 4,
          r"(?:loss\s+scale|reducing)\s+(?:to|to:)\s*0\.\d*[1-9]|"
          r"loss\s+scale\s+to\s*:\s*0\.\d*[1-9]",
          "loss scale", "reducing", min_count=2),

    # ------------------------------------------------------------------ node_lost
    # Slurm: "*** JOB 123 ON node12 CANCELLED AT ... DUE TO NODE FAILURE ***",
    # "srun: error: Node failure on node12"; sacct state NODE_FAIL.
    _rule(_FC.NODE_LOST, 12, r"DUE\s+TO\s+NODE\s+FAILURE|Node\s+failure\s+on\b|\bNODE_FAIL\b",
          "node failure", "node_fail"),
    # Ray: "The node with node id: ... has been marked dead because the detector has missed too
    # many heartbeats from it.", "The actor died because its node has died."
    _rule(_FC.NODE_LOST, 10,
          r"has\s+been\s+marked\s+dead|because\s+its\s+node\s+has\s+died|\bNodeDiedError\b",
          "marked dead", "node has died", "nodediederror"),
)
# fmt: on
