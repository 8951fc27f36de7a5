"""The ssh node agent: the shim over one paramiko connection per node.

Trust is never implicit. The host key must already be in ``ssh.known_hosts``
(or, with ``ssh.accept_new_host_keys``, is appended there on first use, as
OpenSSH's ``StrictHostKeyChecking=accept-new`` does); a *changed* key is always
refused, because that is what a man-in-the-middle looks like. Authentication is by
key only (an identity file without a passphrase, or the ssh agent), never by
password, and no key material is logged or put in an error. Both files must resolve
under a directory the worker allows (``LAZARUS_SSH_DIRS``, default ``~/.ssh``): the
spec that names them comes from the workflow input.

Failures split by what retrying can do: network trouble (refused, timeout, no
route, a connection dropped mid-command) is :class:`NodeUnreachable`, which
``poll`` and ``stop`` turn into ``reachable=False``; a host key or authentication
problem is :class:`NodeRefused`, since the node must not be used as configured.
"""

from __future__ import annotations

import fcntl
import getpass
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
from paramiko.auth_strategy import AuthFailure, AuthSource, AuthStrategy, InMemoryPrivateKey

from activities.nodes.agent import NodeRefused, NodeUnreachable, ShimError
from activities.nodes.shim_agent import LocalShimAgent, ShimAgent
from activities.nodes.shim_calls import ShimReply
from activities.nodes.ssh.config import Hop, SSHConfigError, route
from activities.nodes.ssh.files import SSHDirsError, allowed_ssh_dirs, ssh_file_problem
from activities.nodes.ssh.pool import POOL
from lazarus.domain.spec import NodeSpec, SSHSpec

__all__ = ["LocalShimAgent", "SSHAgent", "ShimError"]

log = logging.getLogger(__name__)

READ_CHUNK = 65536


class _HostKeyRefused(paramiko.SSHException):
    """Raised by our host key policies inside ``connect``; the message is for the user."""


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def host_key_entry(host: str, port: int) -> str:
    """The name a host has in known_hosts (OpenSSH writes non-22 ports as [host]:port)."""
    return host if port == 22 else f"[{host}]:{port}"


def _changed_key_message(where: str, known_hosts: Path, entry: str, expected: str, got: str) -> str:
    return (
        f"{where}: HOST KEY CHANGED: {known_hosts} has {expected} but the host offered {got}. "
        "Someone may be intercepting the connection (man-in-the-middle), or the host was "
        "reinstalled. Verify the new key out of band, then remove the old one "
        f"(ssh-keygen -R '{entry}' -f {known_hosts}); Lazarus never replaces a known key"
    )


def _describe(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"


class _RefuseUnknownHostKey(paramiko.MissingHostKeyPolicy):
    """RejectPolicy, with a message that says how to trust the host."""

    def __init__(self, where: str, host: str, port: int, known_hosts: Path) -> None:
        self.where, self.host, self.port, self.known_hosts = where, host, port, known_hosts

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        raise _HostKeyRefused(
            f"{self.where}: unknown host key ({_describe(key)}); add it to {self.known_hosts} "
            f"(e.g. ssh-keyscan -p {self.port} {self.host} >> {self.known_hosts}) "
            "or set ssh.accept_new_host_keys: true"
        )


class _AcceptNewHostKey(paramiko.MissingHostKeyPolicy):
    """Trust on first use: append the key to known_hosts (never rewrite the file, which
    would drop the user's comments and markers). Agents for several new nodes may do
    this at once, so the file is locked and re-read before appending."""

    def __init__(self, where: str, known_hosts: Path) -> None:
        self.where, self.known_hosts = where, known_hosts

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        self.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.known_hosts, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "r+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            current = paramiko.HostKeys()
            current.load(str(self.known_hosts))
            known = current.lookup(hostname)
            if known is not None:
                same = known.get(key.get_name())
                if same is None or same != key:
                    expected = _describe(same or next(iter(known.values())))
                    raise _HostKeyRefused(
                        _changed_key_message(
                            self.where, self.known_hosts, hostname, expected, _describe(key)
                        )
                    )
            else:
                handle.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
                handle.flush()
                os.fsync(handle.fileno())
                log.warning(
                    "%s: trusted new host key %s, added to %s",
                    self.where,
                    _describe(key),
                    self.known_hosts,
                )
        client.get_host_keys().add(hostname, key.get_name(), key)


class _KeysOnly(AuthStrategy):
    """The identity file, then the ssh agent's keys; nothing else. paramiko's default
    flow falls back to an interactive prompt on stdin when a server wants a second
    factor, which would hang a worker; this strategy never prompts and never sends a
    password."""

    def __init__(self, username: str, pkey: paramiko.PKey | None, use_agent: bool) -> None:
        super().__init__(ssh_config=paramiko.SSHConfig())
        self.username, self.pkey, self.use_agent = username, pkey, use_agent
        self.agent: paramiko.Agent | None = None

    def get_sources(self) -> Iterator[AuthSource]:
        if self.pkey is not None:
            yield InMemoryPrivateKey(self.username, self.pkey)
        if self.use_agent:
            self.agent = paramiko.Agent()
            for key in self.agent.get_keys():
                yield InMemoryPrivateKey(self.username, key)

    def close(self) -> None:
        if self.agent is not None:
            self.agent.close()
            self.agent = None


class SSHAgent(ShimAgent):
    """One SSH connection per agent, opened on first use (or taken from the worker's
    pool of idle ones, :mod:`activities.nodes.ssh.pool`) and reopened lazily after a
    failure; each method is one ``sh -s`` exec on it. Closing parks a connection whose
    last command answered for the next agent of the same node and settings."""

    def __init__(self, node: NodeSpec, ssh: SSHSpec) -> None:
        super().__init__(node)
        self.ssh = ssh
        # A poll must fail fast on a silent host: its staleness is what detects node loss.
        self.status_timeout_s = ssh.command_timeout_s
        self.known_hosts = Path(os.path.expanduser(ssh.known_hosts))
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()
        self._connecting = threading.Lock()
        self._epoch = 0
        self._jumps: dict[paramiko.SSHClient, list[paramiko.SSHClient]] = {}
        """The jump hosts' connections (``ProxyJump``) each open connection runs through."""
        self._pool_key = f"{node.model_dump_json()}|{ssh.model_dump_json()}"
        """Every field of the login: a parked connection serves exactly this one."""
        self._answered = False
        """Whether the last command on the connection answered: only then is it parked."""

    def _where(self) -> str:
        return f"node {self.node.name} ({self.node.host}:{self.node.port})"

    # --- connection -------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection now, without waiting for a connect in progress: a
        silent host holds one for ``connect_timeout_s``, and a supervision that has
        just declared that host lost must hand over at once (it waited about a
        second per node loss). The connect that finishes later finds itself outdated
        (``_epoch``) and closes what it opened."""
        with self._lock:
            client, self._client = self._client, None
            self._epoch += 1
        if client is None:
            return
        transport = client.get_transport()
        if self._answered and transport is not None and transport.is_active():
            POOL.park(self._pool_key, client, self._jumps.pop(client, []))
        else:
            self._close(client)

    def _close(self, client: paramiko.SSHClient) -> None:
        """Close a connection and the jump hosts' connections under it."""
        POOL.release(self._pool_key, client)
        client.close()
        for jump in reversed(self._jumps.pop(client, [])):
            jump.close()

    def node_python(self) -> str:
        return self.node.node_python(self.ssh.python)

    def _drop(self, client: paramiko.SSHClient) -> None:
        """Forget a broken connection (only if no other thread replaced it already)."""
        with self._lock:
            if self._client is client:
                self._client = None
        self._close(client)

    def _connection(self) -> tuple[paramiko.SSHClient, paramiko.Transport]:
        """The open connection, or a new one. One connect at a time (``_connecting``:
        threads that poll one node share it), made outside ``_lock`` so that
        :meth:`close` never waits on it."""
        with self._connecting:
            with self._lock:
                if self._client is not None:
                    transport = self._client.get_transport()
                    if transport is not None and transport.is_active():
                        return self._client, transport
                    self._close(self._client)
                    self._client = None
                epoch = self._epoch
            pooled = POOL.take(self._pool_key)
            if pooled is not None:
                client, self._jumps[pooled[0]] = pooled
            else:
                client = self._connect()
            transport = client.get_transport()
            if transport is None:
                self._close(client)
                raise NodeUnreachable(f"{self._where()}: connection closed right after login")
            with self._lock:
                if self._epoch != epoch:
                    self._close(client)
                    raise NodeUnreachable(f"{self._where()}: the agent was closed meanwhile")
                self._client = client
            POOL.hold(self._pool_key, client)
            return client, transport

    def _identity(self, path: str | None, where: str) -> paramiko.PKey | None:
        if path is None:
            if not self.ssh.use_agent:
                raise NodeRefused(
                    f"{where}: no identity_file and ssh.use_agent is false: no key to log in "
                    "with; set one of them"
                )
            return None
        expanded = os.path.expanduser(path)
        try:
            return paramiko.PKey.from_path(expanded)
        except FileNotFoundError:
            raise NodeRefused(f"{where}: identity_file {path} does not exist") from None
        except IsADirectoryError:
            raise NodeRefused(f"{where}: identity_file {path} is a directory") from None
        except PermissionError:
            raise NodeRefused(
                f"{where}: identity_file {path} is not readable by this user"
            ) from None
        except (paramiko.PasswordRequiredException, TypeError) as exc:
            # cryptography reports an encrypted key as a TypeError about the password.
            if isinstance(exc, TypeError) and "password" not in str(exc).lower():
                raise NodeRefused(
                    f"{where}: identity_file {path} is not a private key paramiko can read "
                    f"({type(exc).__name__})"
                ) from None
            raise NodeRefused(
                f"{where}: identity_file {path} is protected by a passphrase and Lazarus never "
                "prompts; load it into an ssh agent (ssh.use_agent: true, no identity_file) "
                "or use a key without a passphrase"
            ) from None
        except (paramiko.SSHException, ValueError, IndexError, OSError) as exc:
            # The parser's own message could quote the file; the type is enough.
            raise NodeRefused(
                f"{where}: identity_file {path} is not a private key paramiko can read "
                f"({type(exc).__name__}); expected an OpenSSH or PEM private key, not a .pub file"
            ) from None

    def _load_known_hosts(self, client: paramiko.SSHClient) -> None:
        if not self.known_hosts.exists():
            return  # nothing trusted yet: every host is unknown
        try:
            client.get_host_keys().load(str(self.known_hosts))
        except (OSError, UnicodeDecodeError) as exc:
            raise NodeRefused(
                f"{self._where()}: cannot read known_hosts {self.known_hosts}: {_one_line(exc)}"
            ) from None

    def _check_files(self) -> None:
        """Refuse SSH files outside the directories the worker allows
        (:mod:`activities.nodes.ssh.files`): the spec comes from the workflow input, and
        the worker would read the identity file and append host keys to
        ``known_hosts``, wherever they point (issue 37, N13)."""
        try:
            dirs = allowed_ssh_dirs()
        except SSHDirsError as exc:
            raise NodeRefused(f"{self._where()}: {exc}") from None
        for field, path in (
            ("ssh.known_hosts", self.ssh.known_hosts),
            ("identity_file", self.node.identity_file),
            ("ssh.config", self.ssh.config),
        ):
            problem = None if path is None else ssh_file_problem(field, path, dirs)
            if problem is not None:
                raise NodeRefused(f"{self._where()}: {problem}")

    def _connect(self) -> paramiko.SSHClient:
        """Log in to the node, through its jump hosts (``ProxyJump``) if any: each
        hop's host key checked and its login by key only, as the node's own."""
        self._check_files()
        try:
            path = route(self.node, self.ssh)
        except SSHConfigError as exc:
            raise NodeRefused(f"{self._where()}: {exc}") from None
        hops = [*path.jumps, path.target]
        jumps: list[paramiko.SSHClient] = []
        sock: paramiko.Channel | None = None
        try:
            for index, hop in enumerate(hops):
                jump = index < len(path.jumps)
                where = (
                    f"{self._where()} via jump host {hop.name} ({hop.host}:{hop.port})"
                    if jump
                    else self._where()
                )
                client = self._login(hop, where, sock)
                if not jump:
                    self._jumps[client] = jumps
                    return client
                jumps.append(client)
                sock = self._tunnel(client, hops[index + 1], where)
        except BaseException:
            for opened in reversed(jumps):
                opened.close()
            raise
        raise AssertionError("unreachable: the route ends with the node")

    def _tunnel(self, client: paramiko.SSHClient, to: Hop, where: str) -> paramiko.Channel:
        """A ``direct-tcpip`` channel from a jump host to the next hop (``ssh -J``)."""
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            raise NodeUnreachable(f"{where}: connection closed right after login")
        try:
            return transport.open_channel(
                "direct-tcpip",
                (to.host, to.port),
                ("127.0.0.1", 0),
                timeout=self.ssh.connect_timeout_s,
            )
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise NodeUnreachable(
                f"{where}: the jump host cannot reach {to.host}:{to.port}: {_one_line(exc)}"
            ) from None

    def _login(self, hop: Hop, where: str, sock: paramiko.Channel | None) -> paramiko.SSHClient:
        pkey = self._identity(hop.identity_file, where)
        client = paramiko.SSHClient()
        self._load_known_hosts(client)
        policy: paramiko.MissingHostKeyPolicy
        if self.ssh.accept_new_host_keys:
            policy = _AcceptNewHostKey(where, self.known_hosts)
        else:
            policy = _RefuseUnknownHostKey(where, hop.host, hop.port, self.known_hosts)
        client.set_missing_host_key_policy(policy)
        timeout = self.ssh.connect_timeout_s
        user = hop.user or getpass.getuser()
        strategy = _KeysOnly(user, pkey, self.ssh.use_agent)
        try:
            client.connect(
                hop.host,
                port=hop.port,
                sock=sock,
                username=user,
                look_for_keys=False,
                allow_agent=False,  # the strategy asks the agent, if allowed
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                channel_timeout=timeout,
                auth_strategy=strategy,
            )
            transport = client.get_transport()
            if transport is None or not transport.is_authenticated():
                client.close()
                raise NodeRefused(
                    f"{where}: the server wants more than a key for user {user} (a second "
                    "factor or a password); Lazarus logs in with a key only"
                )
        except AuthFailure as exc:
            client.close()
            if not exc.result:
                raise NodeRefused(
                    f"{where}: no key to offer for user {user} ({self._credentials(hop)}); "
                    "set identity_file or load a key into the ssh agent"
                ) from None
            raise NodeRefused(
                f"{where}: authentication refused for user {user} with {self._credentials(hop)}"
            ) from None
        except _HostKeyRefused as exc:
            client.close()
            raise NodeRefused(str(exc)) from None
        except paramiko.BadHostKeyException as exc:
            client.close()
            entry = host_key_entry(hop.host, hop.port)
            raise NodeRefused(
                _changed_key_message(
                    where,
                    self.known_hosts,
                    entry,
                    _describe(exc.expected_key),
                    _describe(exc.key),
                )
            ) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise NodeRefused(
                f"{where}: authentication refused for user {user} with "
                f"{self._credentials(hop)}: {_one_line(exc)}"
            ) from None
        except paramiko.SSHException as exc:
            client.close()
            if "No authentication methods available" in str(exc):
                raise NodeRefused(
                    f"{where}: no key to offer for user {user} ({self._credentials(hop)}); "
                    "set identity_file or load a key into the ssh agent"
                ) from None
            raise NodeUnreachable(f"{where}: ssh handshake failed: {_one_line(exc)}") from None
        except TimeoutError:
            client.close()
            raise NodeUnreachable(f"{where}: connect timed out after {timeout:g} s") from None
        except (OSError, EOFError) as exc:
            client.close()
            raise NodeUnreachable(f"{where}: cannot connect: {_one_line(exc)}") from None
        finally:
            strategy.close()
        return client

    def _credentials(self, hop: Hop) -> str:
        if hop.identity_file is not None:
            extra = " (and the ssh agent)" if self.ssh.use_agent else ""
            return f"identity_file {hop.identity_file}{extra}"
        return "the ssh agent"

    # --- one round trip ---------------------------------------------------------------

    def _run(self, script: bytes, timeout_s: float) -> ShimReply:
        started = time.monotonic()
        client, transport = self._connection()
        self._answered = False
        deadline = time.monotonic() + timeout_s
        # paramiko's channel requests wait without a timeout for a peer that vanished
        # without a TCP reset; closing the transport is what unblocks them.
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            transport.close()

        watchdog = threading.Timer(timeout_s + 1.0, expire)
        watchdog.daemon = True
        watchdog.start()
        chunks: list[bytes] = []
        try:
            channel = transport.open_session(timeout=self.ssh.connect_timeout_s)
            try:
                channel.set_combine_stderr(True)
                channel.exec_command("sh -s")
                channel.sendall(script)
                channel.shutdown_write()
                while True:
                    channel.settimeout(max(deadline - time.monotonic(), 0.001))
                    data = channel.recv(READ_CHUNK)
                    if not data:
                        break
                    chunks.append(data)
                if not channel.status_event.wait(max(deadline - time.monotonic(), 0.1)):
                    raise TimeoutError
                code = channel.recv_exit_status()
            finally:
                channel.close()
        except TimeoutError:
            # A slow answer on a live connection (a loaded host or controller) keeps the
            # connection: dropping it makes the next poll pay a full key exchange under
            # the same load, which times out too, and a live node looks dead (defect 19,
            # issue 10). A dead transport is dropped, and the watchdog bounds the rest.
            if expired.is_set() or not transport.is_active():
                self._drop(client)
            raise NodeUnreachable(f"{self._where()}: no answer within {timeout_s:g} s") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            self._drop(client)
            if expired.is_set():
                raise NodeUnreachable(
                    f"{self._where()}: no answer within {timeout_s:g} s"
                ) from None
            raise NodeUnreachable(f"{self._where()}: connection lost: {_one_line(exc)}") from None
        finally:
            watchdog.cancel()
        if code < 0:
            # No exit status: the session ended without one (sshd or the link died).
            self._drop(client)
            raise NodeUnreachable(f"{self._where()}: connection lost mid-command")
        self._answered = True
        return ShimReply(code, b"".join(chunks), time.monotonic() - started)
