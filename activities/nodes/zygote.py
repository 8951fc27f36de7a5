"""The zygote: a warm fork server that starts ranks with their framework already imported.

A cold rank pays for a fresh interpreter importing torch (about 2 s) on every
(re)launch. The zygote pays it once: it imports the ``--preload`` modules, then
serves fork requests on a Unix socket in its run directory, and each rank is a
fork of it that runs the training script as ``__main__`` (``runpy``).

Started as ``python -m activities.nodes.zygote --run-dir DIR --preload torch
--standby N``. Like :mod:`activities.nodes.rank_wrapper` it forks and the parent
exits at once, so the zygote is never a child of the caller; the survivor starts
a new session. With ``--foreground`` (on Slurm, where the zygote is a job step's
task so that Slurm bounds its life by the step) it serves in the process it was
started as. Standard library only apart from the preloaded modules.

Files in ``DIR``::

    zygote.pid   pid, pgid, start ticks, state, reason, preload results, socket path
    zygote.sock  the request socket (mode 0600)
    zygote.log   the zygote's own stderr (and its standbys' internal errors)

States (``state`` in ``zygote.pid``)::

    starting --preload ok, guards pass--> serving --guard fails before a fork--> refused
        |                                    |
        +--preload fails or guard fails--> refused (stays up, answers every fork
        |                                           request with the reason)
        +--killed / crashed at any time--> dead (pid file's start ticks no longer
                                                 match /proc: clients see "dead")

A client (:mod:`activities.nodes.zygote_client`) that finds it absent, dead,
starting or refused, or gets no answer in time, raises ``ZygoteUnavailable`` and
the launcher cold-starts the rank; nothing is lost but the speed.

Processes. Each fork request is served by a *standby*: a child of the zygote that
has already started its own session and pre-forked the rank process, which waits
on a pipe. The standby then plays exactly the part of rank_wrapper's surviving
child: it writes ``rank-N.pid`` (wrapper_pid = pgid = the standby, plus the rank's
pid and start ticks), waits for the rank and writes ``rank-N.exit.json``; the rank
writes ``rank-N.log``. Supervise, stop and fencing therefore see no difference.
With ``--standby N`` N such pairs sit idle, so a request costs no fork at all, and
the zygote refills the pool after each hand-off; with 0 a pair is forked on
demand. An idle standby exits when its channel to the zygote closes (the zygote
died or was stopped), taking its idle rank process with it, so stopping the zygote
leaves nothing behind and never touches ranks already handed out.

The rank process replaces ``os.environ`` wholesale, ``sys.argv``, the working
directory, ``sys.path[0]`` and stdio (re-created so ``PYTHONUNBUFFERED``/``-u``
mean what they mean in a cold interpreter), reseeds numpy's global generator
(``random`` reseeds itself at fork), restores signal dispositions, and runs the
script. ``SystemExit`` and ``KeyboardInterrupt`` propagate to the real interpreter
exit, and any other exception prints its traceback through ``sys.excepthook`` and
exits 1: exit codes are those of ``python script.py``. Only ``python [-u] [-B]
script|-m module|-c code`` commands run by this zygote's own interpreter are
accepted; anything else is refused with the reason, so the launcher cold-starts
it. So are requests whose environment differs from the zygote's in a variable an
interpreter or an already loaded library reads only at start-up (``PYTHONHASHSEED``,
``OMP_NUM_THREADS``, ``LD_PRELOAD``...): such a rank would silently differ from a
cold one.

Verbs. With ``--verbs`` (started on an ssh or Slurm node) a ``run`` request runs a
node-side verb (:data:`VERBS`) in a plain fork (:mod:`activities.nodes.zygote_socket`).

Pitfall guards:

- CUDA: ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` is set before preloading, so even an
  availability check cannot initialise CUDA here; the zygote runs no tensor
  operation, and refuses to serve if ``torch.cuda.is_initialized()`` is ever true
  (checked before serving and before every fork): a CUDA context does not survive
  a fork.
- Threads: a forked child holds a copy of every lock, including those held by
  threads that do not exist in it. The zygote itself is single-threaded (one
  ``selectors`` loop, no helper threads) and refuses to serve if
  ``threading.active_count() != 1`` after preloading or before any fork. Native
  threads that libraries start on import (OpenBLAS's pool, for one) are recorded
  as ``native_threads`` in the pid file; the pools torch and OpenBLAS start
  register ``pthread_atfork`` handlers and are rebuilt in the child.
- Communicators: the zygote never creates a process group; ranks create theirs
  after the fork, in the child.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import importlib.util
import io
import json
import os
import re
import runpy
import selectors
import shutil
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from activities.nodes.rank_wrapper import exit_record, start_ticks, write_atomic
from activities.nodes.zygote_socket import RUN_OP, SOCKET_FILE, socket_address
from lazarus.domain.memory_tier import environment_on_node

PID_FILE = "zygote.pid"
LOG_FILE = "zygote.log"
MAX_REQUEST_BYTES = 4 << 20
REQUEST_READ_TIMEOUT_S = 5.0
"""A client that connects and sends no complete request within this is dropped."""

STARTUP_ONLY_ENV = (
    "PYTHONHASHSEED",
    "PYTHONOPTIMIZE",
    "PYTHONWARNINGS",
    "PYTHONMALLOC",
    "PYTHONDEVMODE",
    "PYTHONUTF8",
    "PYTHONSAFEPATH",
    "PYTHONHOME",
    "PYTHONPATH",
    "PYTHONNOUSERSITE",
    "PYTHONIOENCODING",
    "PYTHONPLATLIBDIR",
    "PYTHONINSPECT",
    "PYTHONVERBOSE",
    "PYTHONTRACEMALLOC",
    "PYTHONINTMAXSTRDIGITS",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
)
"""Read once when the interpreter or a preloaded library starts: a rank whose
environment differs here from the zygote's would not behave like a cold start."""

_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?$")
_CHANNEL_HEADER = struct.Struct("!I")


class _BecomeRank(BaseException):
    """Raised in a rank process to unwind the zygote's frames before running the
    script from :func:`main`, so the script's exit is the real interpreter's."""

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__("become rank")
        self.spec = spec


class Refused(Exception):
    """A request this zygote will not serve; the message is the reason given to the client."""


# --------------------------------------------------------------------------- requests


def parse_request(
    request: dict[str, Any], zygote_env: dict[str, str], python: str
) -> dict[str, Any]:
    """The run spec a rank process needs, or :class:`Refused` naming the field and why.

    ``python`` is the zygote's interpreter: the command's argv[0] must be it (or a
    ``python*`` name in its directory, the same virtual environment)."""
    rank = request.get("rank")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise Refused(f"field 'rank' must be a non-negative integer, got {rank!r}")
    argv = request.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise Refused(f"field 'argv' must be a non-empty list of strings, got {argv!r}")
    env = request.get("env")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise Refused("field 'env' must be an object of string values")
    for name in ("gen_dir", "cwd"):
        value = request.get(name)
        if not isinstance(value, str) or not os.path.isabs(value) or not os.path.isdir(value):
            raise Refused(f"field {name!r} must be an existing absolute directory, got {value!r}")
    gen_dir, cwd = request["gen_dir"], request["cwd"]
    if os.path.exists(os.path.join(gen_dir, f"rank-{rank}.zygote.claim")):
        raise Refused(f"rank {rank} in {gen_dir} was already claimed by an earlier fork request")
    for name in STARTUP_ONLY_ENV:
        if env.get(name) != zygote_env.get(name):
            raise Refused(
                f"env {name}={env.get(name)!r} differs from the zygote's "
                f"{zygote_env.get(name)!r}; it only takes effect at interpreter start"
            )
    _check_interpreter(argv[0], env, cwd, python)
    spec: dict[str, Any] = {
        "rank": rank,
        "gen_dir": gen_dir,
        "cwd": cwd,
        "env": env,
        "orig_argv": argv,
        "unbuffered": False,
        "dont_write_bytecode": False,
    }
    args = argv[1:]
    while args:
        opt, args = args[0], args[1:]
        if opt == "-u":
            spec["unbuffered"] = True
        elif opt == "-B":
            spec["dont_write_bytecode"] = True
        elif opt in ("-m", "-c") or (opt[:2] in ("-m", "-c") and len(opt) > 2):
            value = opt[2:] if len(opt) > 2 else (args.pop(0) if args else None)
            if value is None:
                raise Refused(f"argv: python option {opt} needs an argument")
            key = "module" if opt.startswith("-m") else "code"
            spec[key] = value
            spec["argv"] = [opt[:2], *args]
            return spec
        elif opt.startswith("-") and opt != "-":
            raise Refused(f"argv: python option {opt!r} is not supported by the zygote")
        elif opt == "-":
            raise Refused("argv: a script read from stdin is not supported by the zygote")
        else:
            spec["script"] = opt
            spec["argv"] = [opt, *args]
            return spec
    raise Refused("argv: no script, -m module or -c code after the interpreter")


def _check_interpreter(argv0: str, env: dict[str, str], cwd: str, python: str) -> None:
    if "/" in argv0:
        candidate = os.path.normpath(os.path.join(cwd, argv0))
    else:
        found = shutil.which(argv0, path=env.get("PATH", os.defpath))
        candidate = os.path.abspath(found) if found else argv0
    if candidate == python:
        return
    same_dir = os.path.dirname(candidate) == os.path.dirname(python)
    if not (_PYTHON_NAME.match(os.path.basename(argv0)) and same_dir):
        raise Refused(
            f"argv[0] {argv0!r} (resolved: {candidate!r}) is not this zygote's interpreter "
            f"{python!r}: only python commands can be forked"
        )


# --------------------------------------------------------------------------- zygote


@dataclass
class _Standby:
    pid: int
    channel: socket.socket


@dataclass
class _Client:
    conn: socket.socket
    deadline: float
    buffer: bytearray = field(default_factory=bytearray)


class _Zygote:
    def __init__(
        self, run_dir: Path, standby: int, record: dict[str, Any], env: dict[str, str]
    ) -> None:
        self.run_dir = run_dir
        self.standby = standby
        self.record = record
        self.env = env
        """The zygote's environment before preloading: requests must match it in
        :data:`STARTUP_ONLY_ENV`."""
        self.python = os.path.abspath(sys.executable)
        self.selector = selectors.DefaultSelector()
        self.pool: list[_Standby] = []
        self.clients: dict[int, _Client] = {}
        self.listener = self._bind()

    # -- state

    def write_record(self, **changes: Any) -> None:
        self.record.update(changes)
        write_atomic(self.run_dir / PID_FILE, self.record)

    @property
    def serving(self) -> bool:
        return bool(self.record["state"] == "serving")

    def refuse(self, reason: str) -> None:
        print(f"lazarus zygote: refusing to serve: {reason}", file=sys.stderr, flush=True)
        for standby in self.pool:
            self._drop(standby)
        self.write_record(state="refused", reason=reason)

    def guard(self) -> bool:
        """Check the pitfall guards; a failure turns the zygote into a refuser for good."""
        if self.serving and (reason := guard_failure()) is not None:
            self.refuse(reason)
        return self.serving

    # -- loop

    def _bind(self) -> socket.socket:
        path = self.run_dir / SOCKET_FILE
        path.unlink(missing_ok=True)
        address, dir_fd = socket_address(self.run_dir)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            listener.bind(address)
        finally:
            os.umask(old_umask)
            if dir_fd is not None:
                os.close(dir_fd)
        os.chmod(path, 0o600)
        listener.listen(64)
        listener.setblocking(False)
        self.selector.register(listener, selectors.EVENT_READ, "listen")
        return listener

    def serve_forever(self) -> None:
        while True:
            self._reap()
            if len(self.pool) < self.standby and self.guard():
                self._add_standby()
                continue  # refill first, but let pending events interleave
            timeout = 0.0 if len(self.pool) < self.standby and self.serving else 0.5
            for key, _ in self.selector.select(timeout):
                if key.data == "listen":
                    self._accept()
                elif isinstance(key.data, _Standby):
                    self._drop(key.data)  # an idle standby only becomes readable at EOF
                else:
                    self._read_client(key.data)
            now = time.monotonic()
            for client in [c for c in self.clients.values() if c.deadline < now]:
                self._answer(client, {"ok": False, "reason": "no complete request in time"})

    def _reap(self) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        conn.setblocking(False)
        client = _Client(conn=conn, deadline=time.monotonic() + REQUEST_READ_TIMEOUT_S)
        self.clients[conn.fileno()] = client
        self.selector.register(conn, selectors.EVENT_READ, client)

    def _read_client(self, client: _Client) -> None:
        try:
            chunk = client.conn.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._close_client(client)
            return
        client.buffer += chunk
        if b"\n" not in client.buffer:
            if len(client.buffer) > MAX_REQUEST_BYTES:
                self._answer(client, {"ok": False, "reason": "request too large"})
            return
        line = bytes(client.buffer[: client.buffer.index(b"\n")])
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("a request is a JSON object")
        except ValueError as exc:
            self._answer(client, {"ok": False, "reason": f"malformed request: {exc}"})
            return
        self._handle(client, request)

    def _handle(self, client: _Client, request: dict[str, Any]) -> None:
        op = request.get("op")
        if op == "status":
            self._answer(
                client,
                {
                    "ok": True,
                    "state": self.record["state"],
                    "reason": self.record.get("reason"),
                    "idle_standby_pids": [s.pid for s in self.pool],
                },
            )
            return
        if op == RUN_OP:
            self._run_verb(client, request)
            return
        if op != "fork":
            self._answer(client, {"ok": False, "reason": f"unknown op {op!r}"})
            return
        if not self.guard():
            self._answer(client, {"ok": False, "reason": self.record["reason"]})
            return
        try:
            spec = parse_request(request, self.env, self.python)
        except Refused as exc:
            self._answer(client, {"ok": False, "reason": str(exc)})
            return
        from_pool = bool(self.pool)
        if from_pool:
            standby = self.pool.pop(0)
            self.selector.unregister(standby.channel)
        else:
            standby = self._fork_standby()
        spec["from_standby"] = from_pool
        payload = json.dumps(spec).encode()
        try:
            socket.send_fds(
                standby.channel,
                [_CHANNEL_HEADER.pack(len(payload)) + payload],
                [client.conn.fileno()],
            )
        except OSError as exc:
            self._answer(client, {"ok": False, "reason": f"standby {standby.pid} lost: {exc}"})
        else:
            self._close_client(client)  # the standby answers on its own copy
        standby.channel.close()

    def _run_verb(self, client: _Client, request: dict[str, Any]) -> None:
        """A node-side verb (:data:`VERBS`) run in a fork of this zygote, which has its
        modules imported (:mod:`activities.nodes.zygote_socket` says why). Not a rank:
        no standby and no pid file; the loop reaps it."""
        verb, stdin = request.get("verb"), request.get("stdin")
        name = VERBS.get(verb, "") if isinstance(verb, str) else ""
        loaded = self.record["preload_results"].get(name, {}).get("ok") is True
        module = sys.modules.get(name) if loaded else None
        if module is None or not isinstance(stdin, str):
            self._answer(client, {"ok": False, "reason": f"verb {verb!r} is not served here"})
            return
        if not self.guard():
            self._answer(client, {"ok": False, "reason": self.record["reason"]})
            return
        if os.fork() == 0:
            conn_fd = os.dup(client.conn.fileno())
            self._close_inherited()
            os._exit(_verb_main(module, conn_fd, stdin.encode()))
        self._close_client(client)

    def _answer(self, client: _Client, reply: dict[str, Any]) -> None:
        try:
            client.conn.setblocking(True)
            client.conn.settimeout(1.0)
            client.conn.sendall(json.dumps(reply).encode() + b"\n")
        except OSError:
            pass
        self._close_client(client)

    def _close_client(self, client: _Client) -> None:
        self.clients.pop(client.conn.fileno(), None)
        self.selector.unregister(client.conn)
        client.conn.close()

    def _drop(self, standby: _Standby) -> None:
        if standby in self.pool:
            self.pool.remove(standby)
        self.selector.unregister(standby.channel)
        standby.channel.close()  # it sees EOF and exits, with its idle rank process

    def _add_standby(self) -> None:
        standby = self._fork_standby()
        self.pool.append(standby)
        self.selector.register(standby.channel, selectors.EVENT_READ, standby)

    def _fork_standby(self) -> _Standby:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:
            mine.close()
            self._close_inherited()
            _standby_main(theirs)  # never returns: raises _BecomeRank in the rank process
        theirs.close()
        return _Standby(pid=pid, channel=mine)

    def _close_inherited(self) -> None:
        """In a fresh standby: drop every descriptor of the zygote's, so the listener
        and other standbys' channels close when the zygote does."""
        for standby in self.pool:
            standby.channel.close()
        for client in self.clients.values():
            client.conn.close()
        self.listener.close()
        self.selector.close()


def guard_failure() -> str | None:
    """Why forking now would be unsafe, or None (the pitfall guards of the docstring)."""
    threads = threading.enumerate()
    if threading.active_count() != 1:
        names = ", ".join(sorted(t.name for t in threads if t is not threading.main_thread()))
        return (
            f"{threading.active_count()} Python threads are running ({names}): a fork "
            "would copy locks held by threads that do not exist in the child"
        )
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        return "CUDA is initialised in the zygote: a CUDA context does not survive fork"
    return None


IMPLIED_PRELOADS: dict[str, tuple[str, ...]] = {"torch": ("torch._dynamo",)}
"""What a framework imports lazily on a rank's path to its first step, warmed with it.
Measured here: the first ``torch.optim`` optimizer imports ``torch._dynamo``, about
1 s on its own (the bench's recovery phase table showed it inside "checkpoint
loaded"); importing it in the zygote starts no thread. A failure here is recorded
but refuses nothing: the rank then pays the import itself, as a cold one would."""


VERBS: dict[str, str] = {"carry": "activities.nodes.carry", "warm": "activities.nodes.warm"}
"""The node-side verbs a ``--verbs`` zygote runs in a fork, by the module whose ``run(stdin,
out)`` runs each; preloaded with its ``ZYGOTE_PRELOAD``, as optional: a verb that failed
to import is refused, and its relay runs it in a process of its own."""


def _verb_main(module: types.ModuleType, conn_fd: int, stdin: bytes) -> int:
    """In the fork: accept, then run the verb with its output on the connection."""
    try:
        with socket.socket(fileno=conn_fd) as conn, conn.makefile("wb") as out:
            conn.setblocking(True)
            out.write(b'{"ok": true}\n')
            out.flush()
            return int(module.run(stdin, out))
    except BaseException:  # the zygote's frames are below: never unwind into them
        traceback.print_exc()
        return 1


def preload(modules: list[str], verbs: bool = False) -> dict[str, dict[str, Any]]:
    """Import each module, recording which failed and why (the launcher's fallback and
    the incident both report it), then the imports each implies
    (:data:`IMPLIED_PRELOADS`) and, with ``verbs``, the :data:`VERBS`, recorded as
    optional. Never raises."""
    results: dict[str, dict[str, Any]] = {}
    implied = [i for name in modules for i in IMPLIED_PRELOADS.get(name, ()) if i not in modules]
    implied += [verb for verb in VERBS.values() if verbs and verb not in modules]
    for name in [*modules, *implied]:
        started = time.monotonic()
        try:
            module = importlib.import_module(name)
            for needed in getattr(module, "ZYGOTE_PRELOAD", ()) if name in VERBS.values() else ():
                importlib.import_module(needed)
        except BaseException as exc:  # a broken module may raise anything, even SystemExit
            results[name] = {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
                "seconds": time.monotonic() - started,
            }
            traceback.print_exc()
        else:
            results[name] = {"ok": True, "error": None, "seconds": time.monotonic() - started}
        if name in implied:
            results[name]["optional"] = True
    return results


def native_threads() -> int:
    return len(os.listdir("/proc/self/task"))


# --------------------------------------------------------------------------- standby


def _standby_main(channel: socket.socket) -> None:
    """A standby: rank_wrapper's surviving child, started before its rank is known."""
    os.setsid()
    # As in rank_wrapper: the group gets SIGTERM from ``stop``, and the standby must
    # outlive its rank long enough to record how it ended.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    read_fd, write_fd = os.pipe()
    rank_pid = os.fork()
    if rank_pid == 0:
        os.close(write_fd)
        channel.close()
        raise _BecomeRank(_wait_for_spec(read_fd))
    os.close(read_fd)
    spec, conn = _receive(channel)
    channel.close()  # from here on the zygote's fate is not ours
    if spec is None or conn is None:
        _abandon(rank_pid)
    assert spec is not None and conn is not None
    rank, gen_dir = int(spec["rank"]), Path(spec["gen_dir"])
    try:
        os.close(os.open(gen_dir / f"rank-{rank}.zygote.claim", os.O_CREAT | os.O_EXCL, 0o644))
    except OSError as exc:
        reason = "an earlier request claimed it" if exc.errno == errno.EEXIST else str(exc)
        _reply(conn, {"ok": False, "reason": f"rank {rank} in {gen_dir}: {reason}"})
        _abandon(rank_pid)
    _send_all(write_fd, json.dumps(spec).encode())  # the rank starts now
    os.close(write_fd)
    me = os.getpid()
    record: dict[str, object] = {
        "rank": rank,
        "wrapper_pid": me,
        "pgid": os.getpgid(0),
        "wrapper_start_ticks": start_ticks(me),
        "pid": rank_pid,
        "start_ticks": start_ticks(rank_pid),
        "started_at": time.time(),
    }
    write_atomic(gen_dir / f"rank-{rank}.pid", record)
    _reply(conn, {"ok": True, "record": record, "from_standby": spec["from_standby"]})
    _, status = os.waitpid(rank_pid, 0)
    returncode = os.waitstatus_to_exitcode(status)
    write_atomic(gen_dir / f"rank-{rank}.exit.json", exit_record(rank, returncode, time.time()))
    os._exit(0)


def _receive(channel: socket.socket) -> tuple[dict[str, Any] | None, socket.socket | None]:
    try:
        data, fds, _, _ = socket.recv_fds(channel, 65536, 1)
    except OSError:
        return None, None
    if not data or not fds:
        return None, None
    conn = socket.socket(fileno=fds[0])
    (length,) = _CHANNEL_HEADER.unpack(data[: _CHANNEL_HEADER.size])
    payload = bytearray(data[_CHANNEL_HEADER.size :])
    while len(payload) < length:
        chunk = channel.recv(length - len(payload))
        if not chunk:
            return None, conn
        payload += chunk
    return json.loads(payload), conn


def _reply(conn: socket.socket, reply: dict[str, Any]) -> None:
    try:
        conn.setblocking(True)
        conn.settimeout(5.0)
        conn.sendall(json.dumps(reply).encode() + b"\n")
    except OSError:
        pass  # the client gave up; it finds the claim and the pid file
    finally:
        conn.close()


def _abandon(rank_pid: int) -> None:
    """End an idle standby and its waiting rank process."""
    try:
        os.kill(rank_pid, signal.SIGKILL)
        os.waitpid(rank_pid, 0)
    except OSError:
        pass
    os._exit(0)


def _send_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _wait_for_spec(fd: int) -> dict[str, Any]:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    if not chunks:
        os._exit(0)  # the standby was ended before it got work
    spec: dict[str, Any] = json.loads(b"".join(chunks))
    return spec


# --------------------------------------------------------------------------- rank

_OLD_STDIO: list[object] = []
"""The zygote's stdio objects, kept alive: collecting one would close fd 1 or 2."""


def _become(spec: dict[str, Any]) -> None:
    """Turn this forked process into what ``python ARGV`` would have started."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    log = os.open(
        Path(spec["gen_dir"]) / f"rank-{spec['rank']}.log",
        os.O_WRONLY | os.O_CREAT | os.O_APPEND,
        0o666,
    )
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    # The memory tier's paths as they lie on this node, for this user.
    env: dict[str, str] = environment_on_node(spec["env"], os.getuid())
    os.environ.clear()
    os.environ.update(env)
    os.chdir(spec["cwd"])
    unbuffered = spec["unbuffered"] or bool(env.get("PYTHONUNBUFFERED"))
    _OLD_STDIO.extend([sys.stdout, sys.stderr])
    encoding = sys.stdout.encoding if sys.stdout is not None else "utf-8"
    sys.stdout = _text_stream(1, encoding, "strict", unbuffered, False)
    sys.stderr = _text_stream(2, encoding, "backslashreplace", unbuffered, True)
    sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr  # type: ignore[misc]
    sys.dont_write_bytecode = spec["dont_write_bytecode"] or bool(
        env.get("PYTHONDONTWRITEBYTECODE")
    )
    sys.argv = list(spec["argv"])
    sys.orig_argv = list(spec["orig_argv"])
    if "script" in spec:
        sys.path[0] = os.path.dirname(os.path.realpath(spec["script"]))
    elif "module" in spec:
        sys.path[0] = os.getcwd()
    else:
        sys.path[0] = ""
    importlib.invalidate_caches()
    if env.get("PYTHONFAULTHANDLER"):
        import faulthandler

        faulthandler.enable()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()  # a cold interpreter seeds it afresh; forks would share one


def _text_stream(
    fd: int, encoding: str, errors: str, unbuffered: bool, line_buffering: bool
) -> io.TextIOWrapper:
    raw = open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)  # noqa: SIM115
    return io.TextIOWrapper(
        raw,
        encoding=encoding,
        errors=errors,
        line_buffering=line_buffering,
        write_through=unbuffered,
    )


def _run_as_main(spec: dict[str, Any]) -> int:
    """Run the rank's program; the exit code as ``python`` would give it."""
    try:
        _become(spec)
    except OSError as exc:
        print(f"lazarus zygote: cannot start rank {spec['rank']}: {exc}", file=sys.stderr)
        return 127
    try:
        if "module" in spec:
            if not _module_exists(spec["module"]):
                print(f"{sys.executable}: No module named {spec['module']}", file=sys.stderr)
                return 1
            runpy.run_module(spec["module"], run_name="__main__", alter_sys=True)
        elif "code" in spec:
            main_module = types.ModuleType("__main__")
            sys.modules["__main__"] = main_module
            exec(compile(spec["code"], "<string>", "exec"), main_module.__dict__)
        else:
            script = os.path.abspath(spec["script"])
            if not os.path.exists(script):
                print(
                    f"{sys.executable}: can't open file {script!r}: "
                    f"[Errno {errno.ENOENT}] No such file or directory",
                    file=sys.stderr,
                )
                return 2
            runpy.run_path(spec["script"], run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise  # the interpreter's own exit handling, exactly as for a cold script
    except BaseException as exc:
        trimmed = _user_frames(exc.__traceback__)
        sys.excepthook(type(exc), exc.with_traceback(trimmed), trimmed)
        return 1
    return 0


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _user_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback from the script's first frame on, without the zygote's and runpy's."""
    skip = {_run_as_main.__code__.co_filename, runpy.run_path.__code__.co_filename}
    while tb is not None and tb.tb_frame.f_code.co_filename in skip:
        tb = tb.tb_next
    return tb


# --------------------------------------------------------------------------- entry


def _already_running(run_dir: Path) -> int | None:
    """The pid of a live zygote already serving ``run_dir``. A killed zygote whose
    reaper has not collected it yet (a zombie: its start ticks still match) is dead."""
    try:
        record = json.loads((run_dir / PID_FILE).read_text())
        pid = int(record["pid"])
        stat = Path(f"/proc/{pid}/stat").read_text()
        state = stat[stat.rindex(")") + 2 :].split()[0]
        if start_ticks(pid) == int(record["start_ticks"]) and state not in ("Z", "X"):
            return pid
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--preload", default="", help="comma-separated modules to import")
    parser.add_argument("--standby", type=int, default=0, help="idle pre-forked ranks to keep")
    parser.add_argument("--verbs", action="store_true", help="serve the node-side VERBS")
    parser.add_argument(
        "--foreground",
        action="store_true",
        help="serve in this process (no fork, no new session): as a Slurm job step's "
        "task, whose life Slurm bounds by the step",
    )
    args = parser.parse_args(argv)
    if args.standby < 0:
        parser.error("--standby must be >= 0")
    modules = [m.strip() for m in args.preload.split(",") if m.strip()]
    run_dir: Path = args.run_dir.absolute()
    run_dir.mkdir(parents=True, exist_ok=True)
    if (running := _already_running(run_dir)) is not None:
        print(f"a zygote is already running in {run_dir} (pid {running})", file=sys.stderr)
        return 1

    if not args.foreground and os.fork() > 0:
        return 0  # the caller reaps this parent; the zygote lives on in the child
    try:
        _zygote(run_dir, modules, args.standby, not args.foreground, args.verbs)
    except _BecomeRank as become:
        spec = become.spec  # a rank process: the zygote's frames are gone now
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    else:
        os._exit(0)
    return _run_as_main(spec)


def _zygote(
    run_dir: Path, modules: list[str], standby: int, new_session: bool, verbs: bool
) -> None:
    if new_session:
        os.setsid()
    elif os.getpgid(0) != os.getpid():
        # A step's task: its own process group, so a stop signals the zygote's group
        # (start ticks checked) without touching the step's other processes.
        os.setpgid(0, 0)
    devnull = os.open(os.devnull, os.O_RDWR)
    log = os.open(run_dir / LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(devnull)
    os.close(log)
    me = os.getpid()
    record: dict[str, Any] = {
        "pid": me,
        "pgid": os.getpgid(0),
        "start_ticks": start_ticks(me),
        "state": "starting",
        "reason": None,
        "socket": str(run_dir / SOCKET_FILE),
        "preload": modules,
        "preload_results": {},
        "standby": standby,
        "python": os.path.abspath(sys.executable),
        "native_threads": None,
        "started_at": time.time(),
        "ready_at": None,
    }
    write_atomic(run_dir / PID_FILE, record)
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    env = dict(os.environ)
    results = preload(modules, verbs)
    zygote = _Zygote(run_dir, standby, record, env)
    failed = {
        name: r["error"] for name, r in results.items() if not r["ok"] and not r.get("optional")
    }
    reason = (
        "preload failed: " + "; ".join(f"{name}: {err}" for name, err in failed.items())
        if failed
        else guard_failure()
    )
    zygote.write_record(
        state="refused" if reason else "serving",
        reason=reason,
        preload_results=results,
        native_threads=native_threads(),
        ready_at=time.time(),
    )
    zygote.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
