"""Tests for lazarus.domain.classifier.

The per-class snippets below are short, hand-written lines in the wording the real
tools print (they are not copies of the fixture logs). The fixture accuracy test
runs the classifier over tests/fixtures/failure-logs, real excerpts from public
GitHub issues.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lazarus.domain.classifier import Classification, RootCause, classify, root_cause
from lazarus.domain.failure_classes import FailureClass as FC
from tests.classifier_accuracy import Sample, evaluate, format_confusion, load_samples

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# (expected class, snippet)
SNIPPETS: list[tuple[FC, str]] = [
    # --- nccl_timeout
    (
        FC.NCCL_TIMEOUT,
        "[rank4]:[E1010 01:02:03.456 ProcessGroupNCCL.cpp:632] [Rank 4] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=77, OpType=ALLGATHER, NumelIn=8, "
        "NumelOut=64, Timeout(ms)=600000) ran for 600107 milliseconds before timing out.",
    ),
    (
        FC.NCCL_TIMEOUT,
        "RuntimeError: [Rank 2] Caught collective operation timeout: WorkNCCL(SeqNum=9, "
        "OpType=BARRIER, Timeout(ms)=60000) ran for 60011 milliseconds before timing out.",
    ),
    (
        FC.NCCL_TIMEOUT,
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:84] Timed "
        "out waiting 300000ms for recv operation to complete",
    ),
    (
        FC.NCCL_TIMEOUT,
        "[PG 0 (default_pg) Rank 1] Heartbeat monitor timed out! Process will be terminated "
        "after dumping debug info. workMetaList_.size()=1",
    ),
    (
        FC.NCCL_TIMEOUT,
        "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f01 in "
        "/opt/venv/lib/python3.11/site-packages/torch/lib/libc10.so)\nframe #1: "
        "c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<"
        "long, std::ratio<1l, 1000l> > >) + 0x1d2 (0x7f02 in /opt/venv/lib/libtorch_cuda.so)",
    ),
    # --- nccl_error
    (
        FC.NCCL_ERROR,
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:2006, unhandled system error (run with NCCL_DEBUG=INFO for "
        "details), NCCL version 2.21.5\nncclSystemError: System call (e.g. socket, malloc) "
        "or external library call failed or device error.",
    ),
    (
        FC.NCCL_ERROR,
        "n7:4411:4502 [2] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from "
        "peer 10.2.0.9<51001> with error 12, opcode 0, len 0, vendor err 129 (Recv)",
    ),
    (
        FC.NCCL_ERROR,
        "ncclRemoteError: A call failed possibly due to a network error or a remote process "
        "exiting prematurely.",
    ),
    (
        FC.NCCL_ERROR,
        "n3:77:91 [2] misc/shmutils.cc:71 NCCL WARN Error: failed to extend /dev/shm/nccl-Ab12 "
        "to 9637892 bytes, error: No space left on device (28)",
    ),
    # --- gpu_hardware
    (FC.GPU_HARDWARE, "RuntimeError: CUDA error: uncorrectable ECC error encountered"),
    (
        FC.GPU_HARDWARE,
        "NVRM: Xid (PCI:0000:81:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen "
        "off the bus.",
    ),
    (
        FC.GPU_HARDWARE,
        "Unable to determine the device handle for GPU 0000:65:00.0: Unknown Error",
    ),
    (
        FC.GPU_HARDWARE,
        "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable\n"
        "    GPU Recovery Action                   : Reset",
    ),
    # --- oom_gpu
    (
        FC.OOM_GPU,
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has "
        "a total capacity of 23.64 GiB of which 1.12 GiB is free.",
    ),
    (FC.OOM_GPU, "RuntimeError: CUDA error: out of memory"),
    # --- oom_host
    (
        FC.OOM_HOST,
        "[812.33] Out of memory: Killed process 9911 (python3) total-vm:99999kB, anon-rss:88888kB",
    ),
    (
        FC.OOM_HOST,
        "slurmstepd: error: Detected 2 oom-kill event(s) in StepId=77.0. Some of your "
        "processes may have been killed by the cgroup out-of-memory handler.",
    ),
    (
        FC.OOM_HOST,
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
    ),
    (
        FC.OOM_HOST,
        "Jun 01 03:04:05 gpu7 systemd-oomd[912]: Killed /system.slice/train.service due to "
        "memory pressure for /system.slice being 83.10% > 80.00% for > 20s with reclaim activity",
    ),
    # --- user_code
    (FC.USER_CODE, "NameError: name 'tokenizer' is not defined"),
    (FC.USER_CODE, "ModuleNotFoundError: No module named 'peft'"),
    (
        FC.USER_CODE,
        "RuntimeError: Error(s) in loading state_dict for GPT:\n\tMissing key(s) in "
        'state_dict: "lm_head.weight".',
    ),
    (FC.USER_CODE, "main.py: error: the following arguments are required: --config"),
    (
        FC.USER_CODE,
        "RuntimeError: Expected to have finished reduction in the prior iteration before "
        "starting a new one.",
    ),
    # --- rendezvous
    (
        FC.RENDEZVOUS,
        "RuntimeError: The server socket has failed to bind to [::]:29500 (errno: 98 - "
        "Address already in use).",
    ),
    (
        FC.RENDEZVOUS,
        "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError",
    ),
    (
        FC.RENDEZVOUS,
        "torch.distributed.DistStoreError: Timed out after 601 seconds waiting for clients. "
        "3/4 clients joined.",
    ),
    (
        FC.RENDEZVOUS,
        '  File "torch/distributed/rendezvous.py", line 172, in _env_rendezvous_handler\n'
        "ValueError: host not found: Name or service not known",
    ),
    # --- storage
    (FC.STORAGE, "OSError: [Errno 28] No space left on device: '/ckpt/step_900/model.pt'"),
    (
        FC.STORAGE,
        "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding "
        "central directory",
    ),
    (FC.STORAGE, "OSError: [Errno 5] Input/output error"),
    (
        FC.STORAGE,
        "RuntimeError: [enforce fail at inline_container.cc:603] . unexpected pos 4096 vs 3990",
    ),
    # --- preempted
    (
        FC.PREEMPTED,
        "slurmstepd: error: *** JOB 4242 ON gpu-07 CANCELLED AT 2024-05-05T05:05:05 DUE TO "
        "TIME LIMIT ***",
    ),
    (
        FC.PREEMPTED,
        "torch/distributed/elastic/agent/server/api.py:704] Received 15 death signal, "
        "shutting down workers",
    ),
    (
        FC.PREEMPTED,
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 31 got signal: 1",
    ),
    # --- numerical
    (FC.NUMERICAL, "FloatingPointError: Loss became infinite or NaN at iteration=88!"),
    (
        FC.NUMERICAL,
        "Exception: Current loss scale already at minimum - cannot decrease scale anymore. "
        "Exiting run.",
    ),
    (FC.NUMERICAL, "{'loss': nan, 'grad_norm': nan, 'learning_rate': 2e-05, 'epoch': 1.3}"),
    # --- the four families of issue 37 (item 6): a cloud's notice in the host's log, a
    # name lookup under the elastic agent's restarts, a torch.load traceback cut inside
    # the archive open, host memory in a framework's or scheduler's words
    (
        FC.PREEMPTED,
        "Mar 02 11:20:01 gpu-7 google_metadata_script_runner[912]: instance/preempted: TRUE; "
        "termination is imminent\nmain.py: line 3: 4121 Killed   python train.py",
    ),
    (
        FC.PREEMPTED,
        '2024/05/01 10:00:00 INF Adding new event to the event store event={"Kind":"SPOT_ITN",'
        '"Description":"Spot ITN received. Instance will be interrupted at 2024-05-01T10:02:00Z"}',
    ),
    (
        FC.PREEMPTED,
        '{"EventId":"A1","EventType":"Preempt","ResourceType":"VirtualMachine","EventStatus":'
        '"Scheduled"}\nexitcode  : -9 (pid: 4242)',
    ),
    (
        FC.PREEMPTED,
        "Jun 12 03:14:15 node-3 systemd-logind[801]: Power key pressed.\n"
        "torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 0",
    ),
    (
        FC.PREEMPTED,
        "Status: Failed\nReason: Terminated\nMessage: Pod was terminated in response to "
        "imminent node shutdown.",
    ),
    (
        FC.RENDEZVOUS,
        "[W socket.cpp:601] [c10d] The IPv4 network addresses of (trainer-0.svc, 29500) cannot "
        "be retrieved (gai error: -3 - Temporary failure in name resolution).\n"
        "WARNING:torch.distributed.elastic.agent.server.api:[default] Worker group FAILED. "
        "2/3 attempts left; will restart worker group\nexitcode  : 1 (pid: 77)",
    ),
    (
        FC.RENDEZVOUS,
        "node-2: ssh: Could not resolve hostname node-2: Name or service not known\n"
        "pdsh@node-1: node-2: ssh exited with exit code 255",
    ),
    (
        FC.STORAGE,
        '  File "/opt/torch/serialization.py", line 1004, in load\n'
        "    with _open_zipfile_reader(opened_file) as opened_zipfile:\n"
        '  File "/opt/torch/serialization.py", line 456, in __init__\n'
        "    super().__init__(torch._C.PyTorchFileReader(name_or_buffer))",
    ),
    (
        FC.STORAGE,
        '  File "/usr/lib/python3.10/site-packages/torch/serialization.py", line 1033, in '
        "_legacy_load\n    magic_number = pickle_module.load(f, **pickle_load_args)",
    ),
    (
        FC.OOM_HOST,
        "slurmstepd: error: Detected 2 oom_kill events in StepId=88.0. Some of your processes "
        "may have been killed by the cgroup out-of-memory handler.",
    ),
    (
        FC.OOM_HOST,
        "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 37.3 GiB for an array "
        "with shape (100000, 100000) and data type float32",
    ),
    (
        FC.OOM_HOST,
        "INFO: [rank: 1] Child process with PID 811 terminated with code -9. Forcefully "
        "terminating all other processes to avoid zombies 🧟",
    ),
    (
        FC.OOM_HOST,
        "distributed.nanny.memory - WARNING - Worker tcp://10.0.0.5:4411 (pid=91) exceeded "
        "95% memory budget. Restarting...",
    ),
    (
        FC.OOM_HOST,
        "ExecutorLostFailure (executor 3 exited caused by one of the running tasks) Reason: "
        "Container killed by YARN for exceeding memory limits. 9.1 GB of 9 GB physical memory",
    ),
    (
        FC.RENDEZVOUS,
        "pdsh@gpu-0: gpu-3: ssh: connect to host gpu-3 port 22: No route to host\n"
        "pdsh@gpu-0: gpu-3: ssh exited with exit code 255",
    ),
    (
        FC.STORAGE,
        "Traceback (most recent call last):\nRuntimeError: Invalid magic number; corrupt file?",
    ),
    (
        FC.STORAGE,
        "Traceback (most recent call last):\n"
        '  File "/opt/ds/runtime/engine.py", line 2935, in load_checkpoint\n'
        "    success = self._load_zero_checkpoint(load_dir, tag)",
    ),
    (
        FC.OOM_HOST,
        "RuntimeError: $ Torch: not enough memory: you tried to allocate 2GB. Buy new RAM!",
    ),
    (
        FC.OOM_GPU,
        "ResourceExhaustedError: OOM when allocating tensor with shape[64,512,512] and type "
        "float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
    ),
]


@pytest.mark.parametrize(("expected", "snippet"), SNIPPETS, ids=lambda v: str(v)[:40])
def test_snippet_class(expected: FC, snippet: str) -> None:
    result = classify(snippet)
    assert result.failure_class == expected, result.scores
    assert result.evidence, "a classified log must come with evidence"
    assert 0.0 < result.confidence <= 1.0


def test_every_labelled_class_has_a_snippet() -> None:
    covered = {cls for cls, _ in SNIPPETS}
    # hang, node_lost and killed come from the supervisor (progress, liveness, the
    # kernel's OOM records), never from log text alone.
    labelled = set(FC) - {FC.HANG, FC.NODE_LOST, FC.UNKNOWN, FC.KILLED}
    assert labelled <= covered


# ---------------------------------------------------------------- precedence


def test_watchdog_timeout_beats_generic_nccl_mentions() -> None:
    log = (
        "NCCL version 2.18.3+cuda12.1\n"
        "[E ProcessGroupNCCL.cpp:475] [Rank 3] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800123 "
        "milliseconds before timing out.\n"
        "[E ProcessGroupNCCL.cpp:489] Some NCCL operations have failed or timed out.\n"
        "torch.distributed.DistBackendError: NCCL communicator was aborted on rank 3.\n"
    )
    assert classify(log).failure_class == FC.NCCL_TIMEOUT


def test_ecc_inside_nccl_watchdog_is_hardware() -> None:
    log = (
        "[E ProcessGroupNCCL.cpp:916] [Rank 1] NCCL watchdog thread terminated with "
        "exception: CUDA error: uncorrectable ECC error encountered\n"
        "[E ProcessGroupNCCL.cpp:489] Some NCCL operations have failed or timed out.\n"
    )
    assert classify(log).failure_class == FC.GPU_HARDWARE


def test_oom_on_one_rank_beats_timeouts_on_the_others() -> None:
    timeout = (
        "[rank{r}]:[E ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, Timeout(ms)=600000) ran "
        "for 600010 milliseconds before timing out.\n"
    )
    log = "[rank5]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB.\n"
    log += "".join(timeout.format(r=r) for r in range(5))
    result = classify(log)
    assert result.failure_class == FC.OOM_GPU
    assert result.suspect_rank == 5


def test_illegal_memory_access_alone_is_not_hardware() -> None:
    log = "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    assert classify(log).failure_class == FC.USER_CODE


def test_illegal_memory_access_with_xid_is_hardware() -> None:
    log = (
        "NVRM: Xid (PCI:0000:3b:00): 31, pid=101, name=python, Ch 00000010, MMU Fault\n"
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    assert classify(log).failure_class == FC.GPU_HARDWARE


def test_launcher_sigterm_cleanup_is_not_preemption() -> None:
    log = (
        "W0101 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 11 "
        "closing signal SIGTERM\n"
        "W0101 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 12 "
        "closing signal SIGTERM\n"
        "E0101 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) "
        "local_rank: 2 (pid: 13) of binary: /usr/bin/python\n"
        "[rank2]: KeyError: 'pixel_values'\n"
    )
    assert classify(log).failure_class == FC.USER_CODE


def test_bare_sigkill_from_torchrun_means_host_oom() -> None:
    log = (
        "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 7 closing "
        "signal SIGTERM\n"
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) "
        "local_rank: 1 (pid: 8) of binary: /opt/conda/bin/python\n"
    )
    result = classify(log)
    assert result.failure_class == FC.OOM_HOST
    assert result.suspect_rank == 1
    assert result.circumstantial, "only a -9: the supervisor must look for kernel evidence"


def test_an_explicit_oom_message_is_not_circumstantial() -> None:
    log = "[ 812.1] Out of memory: Killed process 4242 (python) total-vm:81234kB\n"
    result = classify(log, exit_code=-9, signal="SIGKILL")
    assert result.failure_class == FC.OOM_HOST and not result.circumstantial


def test_time_limit_then_sigkill_is_preemption() -> None:
    log = (
        "slurmstepd: error: *** STEP 1.0 ON n1 CANCELLED AT 2024-01-01T00:00:00 DUE TO "
        "TIME LIMIT ***\n"
        "failed (exitcode: -9) local_rank: 0 (pid: 5)\n"
        "traceback : Signal 9 (SIGKILL) received by PID 5\n"
    )
    assert classify(log).failure_class == FC.PREEMPTED


def test_a_few_early_fp16_overflows_are_not_divergence() -> None:
    log = (
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing "
        "to 32768\n"
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 32768, reducing "
        "to 16384\n"
        "RuntimeError: The server socket has failed to listen on any local network address."
        " (errno: 98 - Address already in use)\n"
    )
    assert classify(log).failure_class == FC.RENDEZVOUS


def test_repeated_overflow_collapse_is_numerical() -> None:
    log = "".join(
        f"Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {s}\n"
        for s in (0.5, 0.25, 0.125, 0.0625)
    )
    assert classify(log).failure_class == FC.NUMERICAL


def test_checkpoint_path_typo_is_user_code_not_storage() -> None:
    log = (
        '  File "/usr/lib/python3/site-packages/torch/serialization.py", line 771, in load\n'
        "    with _open_file_like(f, 'rb') as opened_file:\n"
        "FileNotFoundError: [Errno 2] No such file or directory: 'ckpt/last.pt'\n"
    )
    assert classify(log).failure_class == FC.USER_CODE


def test_hard_wrapped_phrase_still_matches() -> None:
    line = (
        "[E ProcessGroupNCCL.cpp:475] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=1, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600010 ms"
    )
    wrapped = "\n".join(line[i : i + 70] for i in range(0, len(line), 70)) + "\n"
    wrapped += "\n".join(["x" * 70, "y" * 70, "end"])  # more lines cut at the same width
    assert classify(wrapped).failure_class == FC.NCCL_TIMEOUT


# ---------------------------------------------------------------- exit code / signal hints


@pytest.mark.parametrize(
    ("exit_code", "signal", "expected"),
    [
        (137, None, FC.OOM_HOST),
        (-9, None, FC.OOM_HOST),
        (None, "SIGKILL", FC.OOM_HOST),
        (143, None, FC.PREEMPTED),
        (-15, None, FC.PREEMPTED),
        (None, "SIGTERM", FC.PREEMPTED),
        (None, "Signals.SIGHUP", FC.PREEMPTED),
        (None, None, FC.UNKNOWN),
        (0, None, FC.UNKNOWN),
    ],
)
def test_exit_code_and_signal_hints_on_thin_text(
    exit_code: int | None, signal: str | None, expected: FC
) -> None:
    result = classify("step 100 loss 2.31\nstep 101 loss 2.30\n", exit_code, signal)
    assert result.failure_class == expected


def test_exit_hint_does_not_override_explicit_text() -> None:
    log = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB\n"
    assert classify(log, exit_code=-9, signal="SIGKILL").failure_class == FC.OOM_GPU


@pytest.mark.parametrize(
    "log",
    [
        "",
        "epoch 1 step 10 loss 3.2\nepoch 1 step 20 loss 3.1\n",
        "NCCL INFO Channel 00/02 : 0 1 2 3\nNCCL INFO Connected all rings\n",
        "n1:1:1 [0] NCCL WARN NET/Plugin : Plugin load returned 2 : libnccl-net.so: cannot "
        "open shared object file\n",
        "| epoch 003 | loss 4.1 | oom 0 | wall 991\n",
    ],
)
def test_benign_logs_are_unknown(log: str) -> None:
    result = classify(log)
    assert result.failure_class == FC.UNKNOWN
    assert result.evidence == []
    assert result.confidence == 0.0


# ---------------------------------------------------------------- families: root cause over wording


def test_no_space_in_nccl_shared_memory_is_nccl_not_the_checkpoint_disk() -> None:
    shm = (
        "h:1:2 [0] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space left "
        "on device\n"
    )
    disk = "OSError: [Errno 28] No space left on device: '/ckpt/step_20/optim.pt'\n"
    assert classify(shm).failure_class == FC.NCCL_ERROR
    assert classify(disk).failure_class == FC.STORAGE


def test_bus_error_names_nccl_shm_only_with_nccl_in_the_process() -> None:
    bus = (
        "[n1:4410] Signal: Bus error (7)\n"
        "  exitcode  : -7 (pid: 4410)\n"
        "  traceback : Signal 7 (SIGBUS) received by PID 4410\n"
    )
    nccl = "n1:4410:4433 [0] NCCL INFO Channel 00/02 :    0   1\n"
    assert classify(nccl + bus).failure_class == FC.NCCL_ERROR
    assert classify(bus).failure_class != FC.NCCL_ERROR


def test_dataloader_bus_error_stays_host_memory_next_to_nccl_chatter() -> None:
    log = (
        "n1:4410:4433 [0] NCCL INFO Channel 00/02 :    0   1\n"
        "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient "
        "shared memory (shm).\n"
        "RuntimeError: DataLoader worker (pid 4471) is killed by signal: Bus error.\n"
    )
    assert classify(log).failure_class == FC.OOM_HOST


def test_torch_multiprocessing_shm_full_is_not_the_checkpoint_disk() -> None:
    log = (
        "RuntimeError: unable to write to file </torch_812_3342_0>: No space left on device (28)\n"
    )
    assert classify(log).failure_class == FC.OOM_HOST


def test_nccl_shm_failure_beats_the_slurm_teardown_and_peer_timeouts() -> None:
    log = (
        "torch.distributed.DistBackendError: NCCL error in: NCCLUtils.hpp:268, unhandled system "
        "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n"
        "Last error:\n"
        "Error while creating shared memory segment /dev/shm/nccl-1Ys (size 7340384)\n"
        "[rank1]:[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600100 "
        "milliseconds before timing out.\n"
        "srun: error: n4: task 5: Exited with exit code 1\n"
        "slurmstepd: error: *** STEP 11.0 ON n4 CANCELLED AT 2025-02-17T10:02:11 ***\n"
    )
    assert classify(log).failure_class == FC.NCCL_ERROR


def test_ipv6_lookup_warning_alone_is_not_a_rendezvous_failure() -> None:
    warning = (
        "[W socket.cpp:697] [c10d] The IPv6 network addresses of (mac.local, 56412) cannot be "
        "retrieved (gai error: 8 - nodename nor servname provided, or not known).\n"
    )
    assert classify(warning).failure_class == FC.UNKNOWN
    assert classify(warning + "KeyError: 'labels'\n").failure_class == FC.USER_CODE


def test_unresolvable_master_addr_is_rendezvous() -> None:
    log = (
        "[W socket.cpp:558] [c10d] The IPv4 network addresses of (trainer-0.svc, 29500) cannot "
        "be retrieved (gai error: -2 - Name or service not known).\n"
        "[E socket.cpp:610] [c10d] The client socket has failed to connect to any network "
        "address of (trainer-0.svc, 29500).\n"
    )
    assert classify(log).failure_class == FC.RENDEZVOUS
    gai = (
        "torch.distributed.elastic.multiprocessing.api: failed (exitcode: 1)\n"
        "socket.gaierror: [Errno -3] Temporary failure in name resolution\n"
    )
    assert classify(gai).failure_class == FC.RENDEZVOUS


def test_failed_model_download_lookup_is_not_rendezvous() -> None:
    log = (
        "torchrun --nproc-per-node 8 train.py\n"
        "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='huggingface.co', "
        'port=443): Max retries exceeded (Caused by NameResolutionError("Failed to resolve '
        "'huggingface.co' ([Errno -3] Temporary failure in name resolution)\"))\n"
    )
    assert classify(log).failure_class != FC.RENDEZVOUS


def test_memory_monitor_sigterm_is_host_oom_not_preemption() -> None:
    log = (
        "Aug 04 10:39:10 n2 earlyoom[845]: low memory! at or below SIGTERM limits: mem  3.00%\n"
        'Aug 04 10:39:10 n2 earlyoom[845]: sending SIGTERM to process 3226 uid 1000 "python"\n'
        "torch/distributed/elastic/agent/server/api.py:704] Received 15 death signal, shutting "
        "down workers\n"
    )
    result = classify(log)
    assert result.failure_class == FC.OOM_HOST and not result.circumstantial


def test_ray_memory_monitor_detail_alone_is_host_oom() -> None:
    log = (
        "Memory on the node (IP: 10.0.3.220, ID: d8d8) where the task (task ID: b909, name=trai\n"
        "failed (exitcode: -9) local_rank: 1 (pid: 803) of binary: /usr/bin/python\n"
    )
    result = classify(log)
    assert result.failure_class == FC.OOM_HOST and not result.circumstantial


def test_a_web_lookup_failure_in_a_torchrun_log_is_not_rendezvous() -> None:
    log = (
        "torchrun --nproc_per_node 2 train.py\n"
        "wandb: Network error (ConnectionError), entering retry loop.\n"
        "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='api.wandb.ai', "
        "port=443): Max retries exceeded (Caused by NameResolutionError: Failed to resolve "
        "'api.wandb.ai' ([Errno -3] Temporary failure in name resolution))\n"
    )
    assert classify(log).failure_class != FC.RENDEZVOUS


def test_a_load_that_failed_after_opening_the_archive_is_not_storage() -> None:
    log = (
        '  File "/opt/torch/serialization.py", line 1040, in load\n'
        "    return _load(opened_zipfile, map_location, pickle_module, **pickle_load_args)\n"
        "RuntimeError: Attempting to deserialize object on a CUDA device but "
        "torch.cuda.is_available() is False.\n"
    )
    assert classify(log).failure_class != FC.STORAGE


def test_tensorflow_oom_on_the_cpu_is_host_memory() -> None:
    log = (
        "ResourceExhaustedError: OOM when allocating tensor with shape[8,1024,1024] and type "
        "float on /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu"
    )
    assert classify(log).failure_class == FC.OOM_HOST


def test_busy_gpu_that_needs_a_reset_beats_the_python_wrapper() -> None:
    log = (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 12, in <module>\n'
        "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable\n"
        "failed (exitcode: 1) local_rank: 0 (pid: 77) of binary: /usr/bin/python\n"
        "ValueError: wrapper gave up after 3 retries\n"
        "[ 1843.3] NVRM: GPU 0000:b3:00.0: GPU recovery action changed from 0x0 (None) to 0x1 "
        "(GPU Reset Required)\n"
    )
    assert classify(log).failure_class == FC.GPU_HARDWARE


HARD = FIXTURES / "failure-logs-hard"


@pytest.mark.parametrize("sample", load_samples(HARD), ids=lambda s: s.file)
def test_hard_real_excerpts(sample: Sample) -> None:
    """Real excerpts with buried causes and launcher wrappers (README in that folder)."""
    result = classify(sample.text)
    assert result.failure_class == sample.label, (sample.meta.get("family"), result.scores)


# ---------------------------------------------------------------- suspects


def test_suspect_from_torchrun_root_cause_block() -> None:
    log = (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        "Root Cause (first observed failure):\n"
        "[0]:\n"
        "  time      : 2024-03-03_03:03:03\n"
        "  host      : trainer-node-12\n"
        "  rank      : 13 (local_rank: 5)\n"
        "  exitcode  : -9 (pid: 777)\n"
        "  traceback : Signal 9 (SIGKILL) received by PID 777\n"
    )
    result = classify(log)
    assert result.failure_class == FC.OOM_HOST
    assert (result.suspect_rank, result.suspect_node) == (13, "trainer-node-12")


def test_suspect_from_nccl_host_prefix() -> None:
    log = (
        "gpu-a-17:9:12 [3] transport/net_ib.cc:93 NCCL WARN NET/IB : Got async event : port error\n"
    )
    result = classify(log)
    assert result.failure_class == FC.NCCL_ERROR
    assert result.suspect_node == "gpu-a-17"


def test_suspect_from_slurm_line() -> None:
    log = (
        "slurmstepd: error: *** JOB 9 ON dgx-03 CANCELLED AT 2024-01-01T00:00:00 DUE TO "
        "PREEMPTION ***\n"
    )
    assert classify(log).suspect_node == "dgx-03"


@pytest.mark.parametrize(
    ("line", "rank"),
    [
        ("[rank6]: RuntimeError: CUDA error: out of memory", 6),
        ("[E ProcessGroupNCCL.cpp:1] [Rank 2] Watchdog caught collective operation timeout", 2),
        ("AssertionError: Rank 11: found NaN in local grad norm in backward pass", 11),
    ],
)
def test_suspect_rank_prefixes(line: str, rank: int) -> None:
    assert classify(line).suspect_rank == rank


def test_evidence_lines_come_from_the_log() -> None:
    log = "step 1\n" * 50 + "OSError: [Errno 28] No space left on device\n" + "bye\n"
    result = classify(log)
    assert result.failure_class == FC.STORAGE
    assert result.evidence == ["OSError: [Errno 28] No space left on device"]
    assert len(result.evidence) <= 5


# ---------------------------------------------------------------- properties


def test_deterministic_and_pure() -> None:
    log = (FIXTURES / "failure-logs" / "004.log").read_text()
    first = classify(log)
    assert classify(log) == first
    assert isinstance(first, Classification)
    assert first.scores[str(first.failure_class)] == max(first.scores.values())


def test_one_megabyte_tail_is_fast() -> None:
    filler = "".join(
        f"iteration {i:>6}/ 90000 | lm loss: 2.4E+00 | loss scale: 65536.0 | grad norm: "
        f"0.61 | number of nan iterations: 0 |\n"
        for i in range(9000)
    )
    log = filler + (FIXTURES / "failure-logs" / "024.log").read_text()
    assert len(log) > 1_000_000
    best = min(_timed(log) for _ in range(3))
    assert classify(log).failure_class == FC.NCCL_TIMEOUT
    # The target is well under 100 ms; the bound leaves room for a busy CI machine.
    assert best < 0.5, f"classify took {best * 1000:.0f} ms on a 1 MB tail"


def _timed(log: str) -> float:
    t0 = time.perf_counter()
    classify(log)
    return time.perf_counter() - t0


# ---------------------------------------------------------------- root_cause


def _c(cls: FC) -> Classification:
    return Classification(cls, [], 1.0, None, None, {str(cls): 10.0})


def test_root_cause_is_earliest_failure() -> None:
    reports = [
        (0, 105.0, _c(FC.NCCL_TIMEOUT)),
        (3, 100.0, _c(FC.OOM_GPU)),
        (1, 105.5, _c(FC.NCCL_TIMEOUT)),
    ]
    rc = root_cause(reports)
    assert isinstance(rc, RootCause)
    assert (rc.rank, rc.classification.failure_class) == (3, FC.OOM_GPU)
    assert [r[0] for r in rc.collateral] == [0, 1]


def test_root_cause_tie_prefers_concrete_cause() -> None:
    reports = [(0, 50.0, _c(FC.NCCL_TIMEOUT)), (7, 50.0, _c(FC.GPU_HARDWARE))]
    assert root_cause(reports).rank == 7


def test_root_cause_needs_reports() -> None:
    with pytest.raises(ValueError):
        root_cause([])


# ---------------------------------------------------------------- fixture accuracy


def _check_accuracy(directory: Path, minimum: float) -> None:
    report = evaluate(directory.name, load_samples(directory))
    if report.accuracy < minimum:
        misses = "\n".join(f"  {f}: true={t} predicted={p}" for f, t, p in report.mistakes())
        pytest.fail(
            f"accuracy {report.accuracy:.3f} < {minimum} on {directory}\n"
            f"{format_confusion(report)}\n{misses}"
        )


def test_accuracy_on_fixture_logs() -> None:
    """Real excerpts from public issues (copied from the shared failure-log set)."""
    _check_accuracy(FIXTURES / "failure-logs", 0.90)


def test_accuracy_on_synthetic_logs() -> None:
    """Snippets written by us from real message wordings; see the bench for details."""
    _check_accuracy(FIXTURES / "failure-logs-synthetic", 0.90)


CAPTURED = Path(__file__).resolve().parents[1] / "fixtures" / "captured-logs"


@pytest.mark.parametrize(
    ("name", "expected"),
    [("gloo-pair-closure-timeout.log", "nccl_timeout")],
)
def test_logs_captured_from_our_own_torch_runs(name: str, expected: str) -> None:
    """Wordings of the torch build we run (2.13, gloo) that the shared corpus lacks."""
    result = classify((CAPTURED / name).read_text(), exit_code=1)
    assert result.failure_class == expected, result.evidence
