"""Cutting a survivor's step short once the controller asks it to rejoin.

A survivor learns of a dead peer at its next collective: gloo fails it within
milliseconds of the death, but only once the rank gets there. A step spends most of
its time in the rank's own work (the forward pass, the data loader, the example's
sleep), and the controller has written the survivor's rejoin request long before that
work ends. Measured before this module (``python -m bench state-scale``, a 1 s step
whose gradient all-reduce comes at its end, the kill just after a step): the survivor
tore down 1.1 to 1.2 s after the SIGKILL at every state size, the longest part of a
rejoin whose replacement was ready at 0.9 s.

How: :func:`install` (called by :func:`lazarus.rank.torch.run_resilient` in the main
thread) gives :data:`INTERRUPT_SIGNAL` a handler. While ``train`` runs (:func:`armed`),
a watch thread looks at the control file every :data:`WATCH_INTERVAL_S` (one
``stat``; read only when it changed). Once a rejoin request names this rank, the
thread sends the signal to the main thread, whose handler raises
:class:`~lazarus.rank.rejoin_requests.RejoinRequested` where the step is: in a
``time.sleep`` (which the signal interrupts), between two torch operations, in the
data loader. ``run_resilient`` tears down and rejoins, as it does when a heartbeat
raises the same exception.

Sooner still: the supervisor writes its notice that a rank of the generation ended
(:data:`lazarus.domain.environment.GENERATION_FAILED_FILE`, beside the control file) as it reports
the failure, before the workflow has searched for the resume point and the launch has
written any request. The watch looks for it too (a second ``stat``) and the handler
raises :class:`~lazarus.rank.rejoin_requests.GenerationFailed`: the survivor tears
down then, as when its collective fails, and waits for its request. Traced at 256
MiB on the ssh test hosts: a survivor asleep in its step tore down 0.9 to 1.0 s after
the kill (the request's time), and one whose collective failed at 0.25 to 0.67 s; the
new group then formed 0.5 s and 0.1 to 0.3 s after that.

Why it is safe to cut a step anywhere:

* the survivor loads the next generation's resume point into its state before it
  trains again, so whatever the cut step had half changed (an optimizer step half
  applied, a batch half consumed) is overwritten;
* the handler raises only while ``train`` runs and only once per request: never in
  the helper's teardown, its wait for the request or its load;
* a call in C or C++ (a collective, a kernel, a ``torch.save``) finishes first:
  Python runs signal handlers between bytecodes;
* a script that must not be cut mid-step passes ``interrupt=False`` to
  ``run_resilient`` and leaves at its next heartbeat or collective, as before; a
  script that set its own handler for the signal keeps it, and nothing is sent.

Not on NCCL: there the watch in :mod:`lazarus.rank.torch` aborts the communicators, so
a main thread blocked on the GPU returns; cutting the host's Python short on a GPU
node was not measured here.

Standard library only, like the rest of :mod:`lazarus.rank`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

from lazarus.domain import environment
from lazarus.rank import control
from lazarus.rank.identity import _generation_now, _rank_now
from lazarus.rank.rejoin_requests import GenerationFailed, RejoinRequested

__all__ = ["INTERRUPT_SIGNAL", "WATCH_INTERVAL_S", "armed", "install"]

_SIGRTMAX: int | None = getattr(signal, "SIGRTMAX", None)
INTERRUPT_SIGNAL: int | None = None if _SIGRTMAX is None else int(_SIGRTMAX) - 4
"""A real-time signal, which nothing in torch, Slurm or the common launchers uses
(SIGUSR1 and SIGUSR2 are Slurm's and Lightning's). None where the platform has none:
then no step is cut short."""
WATCH_INTERVAL_S = 0.05
"""How often the watch looks at the control file: one ``stat``, 20 a second."""

_installed = False
_armed = False
_pending: Exception | None = None
"""What the watch signalled, until the handler raised it."""


def install() -> bool:
    """Give :data:`INTERRUPT_SIGNAL` this module's handler; True when it has it. Only
    from the main thread (where Python runs handlers); never over a handler the script
    set itself."""
    global _installed
    if INTERRUPT_SIGNAL is None or threading.current_thread() is not threading.main_thread():
        return False
    current = signal.getsignal(INTERRUPT_SIGNAL)
    if current is not _handle and current not in (signal.SIG_DFL, None):
        return False
    signal.signal(INTERRUPT_SIGNAL, _handle)
    _installed = True
    return True


@contextlib.contextmanager
def armed(enabled: bool = True) -> Iterator[None]:
    """While the block runs (``train``), a rejoin request naming this rank cuts the
    main thread's work short with :class:`RejoinRequested`. A no-op unless
    :func:`install` succeeded and ``enabled``."""
    global _armed, _pending
    if not (enabled and _installed) or INTERRUPT_SIGNAL is None:
        yield
        return
    stop = threading.Event()
    _pending = None
    _armed = True
    watch = threading.Thread(
        target=_watch,
        args=(stop, threading.get_ident(), INTERRUPT_SIGNAL),
        name="lazarus-step-interrupt",
        daemon=True,
    )
    watch.start()
    try:
        yield
    finally:
        _armed = False  # first: a signal still on its way finds nothing to raise
        _pending = None
        stop.set()


def _handle(signum: int, frame: FrameType | None) -> None:
    global _pending
    pending = _pending
    if not _armed or pending is None:
        return  # after train returned, or not ours: the rejoin path reads the request
    _pending = None
    raise pending


def _watch(stop: threading.Event, main_thread: int, signum: int) -> None:
    """Until ``stop``: the control file, read when it changed, and the generation's
    failure notice beside it; signal the main thread once a rejoin request names this
    rank or the notice is there, then end."""
    global _pending
    path = os.environ.get(environment.CONTROL_FILE)
    if not path:
        return
    failed = os.path.join(os.path.dirname(path), environment.GENERATION_FAILED_FILE)
    seen: tuple[int, int, int] | None = None
    while not stop.wait(WATCH_INTERVAL_S):
        pending: Exception | None = None
        signature = control.file_signature(path)
        if signature is not None and signature != seen:
            seen = signature
            request = control.rejoin_request_now()
            if request is not None:
                pending = RejoinRequested(_rank_now(), request.generation)
                why = f"is asked to rejoin generation {request.generation}"
        if pending is None and os.path.exists(failed):
            ended = f"a rank of generation {_generation_now()} ended"
            pending = GenerationFailed(f"the supervisor's notice: {ended}")
            why = f"is told {ended}"
        if pending is None:
            continue
        if stop.is_set() or signal.getsignal(signum) is not _handle:
            return  # train returned meanwhile, or the script took the signal over
        print(
            f"lazarus.rank: rank {_rank_now()} {why}; cutting its step short",
            file=sys.stderr,
            flush=True,
        )
        _pending = pending
        signal.pthread_kill(main_thread, signum)
        return
