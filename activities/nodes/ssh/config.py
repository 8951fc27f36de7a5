"""Where an ssh node really is: OpenSSH's client configuration (``ssh.config``,
default ``~/.ssh/config``) applied to its ``host``, as ``ssh HOST`` would.

Read: ``HostName``, ``User``, ``Port``, ``IdentityFile`` (the first that exists) and
``ProxyJump`` (``[user@]host[:port]``, comma-separated for a chain, each hop looked
up in the same file for its own ``HostName``, ``User``, ``Port`` and
``IdentityFile``; a hop's own ``ProxyJump`` is not followed). What the node's spec
sets wins: ``user``, a ``port`` other than 22, ``identity_file``. A missing file is
no error (there is nothing to apply); an unreadable one refuses the node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from lazarus.domain.spec import NodeSpec, SSHSpec

DEFAULT_PORT = 22


class SSHConfigError(ValueError):
    """The configuration cannot be used; the message names the file or the entry."""


@dataclass(frozen=True)
class Hop:
    """One SSH login: the address connected to, and the name the user gave it."""

    name: str
    """As written (an alias, or the address itself): for messages."""
    host: str
    port: int
    user: str | None
    identity_file: str | None


@dataclass(frozen=True)
class Route:
    """The node's login, and the jump hosts before it, first hop first."""

    target: Hop
    jumps: list[Hop] = field(default_factory=list)


def _load(path: str | None) -> paramiko.SSHConfig | None:
    if path is None:
        return None
    expanded = Path(os.path.expanduser(path))
    if not expanded.exists():
        return None
    try:
        return paramiko.SSHConfig.from_path(str(expanded))
    except (OSError, UnicodeDecodeError, paramiko.ConfigParseError, ValueError) as exc:
        raise SSHConfigError(f"ssh.config: cannot read {path}: {exc}") from None


def _first_identity(found: paramiko.SSHConfigDict) -> str | None:
    files = found.get("identityfile")
    if not files:
        return None
    for name in files:
        if Path(os.path.expanduser(name)).exists():
            return str(name)
    return str(files[0])  # none exists: the key check says so, naming it


def _port(text: object, where: str) -> int:
    try:
        port = int(str(text))
    except ValueError:
        raise SSHConfigError(f"ssh.config: {where}: port {text!r} is not a number") from None
    if not 1 <= port <= 65535:
        raise SSHConfigError(f"ssh.config: {where}: port {port} is out of range")
    return port


def _hop(config: paramiko.SSHConfig | None, name: str, user: str | None, port: int | None) -> Hop:
    found = config.lookup(name) if config is not None else paramiko.SSHConfigDict()
    return Hop(
        name=name,
        host=str(found.get("hostname", name)),
        port=port if port is not None else _port(found.get("port", DEFAULT_PORT), name),
        user=user or found.get("user"),
        identity_file=_first_identity(found),
    )


def _jump(config: paramiko.SSHConfig | None, text: str) -> Hop:
    """``[user@]host[:port]`` (or ``[host]:port`` for an IPv6 address)."""
    user, _, rest = text.rpartition("@")
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port = _port(tail[1:], text) if tail.startswith(":") else None
    elif rest.count(":") == 1:
        host, _, port_text = rest.partition(":")
        port = _port(port_text, text)
    else:
        host, port = rest, None
    if not host:
        raise SSHConfigError(f"ssh.config: ProxyJump entry {text!r} names no host")
    return _hop(config, host, user or None, port)


def route(node: NodeSpec, ssh: SSHSpec) -> Route:
    """The node's login (its spec over the configuration) and its jump hosts."""
    config = _load(ssh.config)
    target = _hop(config, node.host, node.user, node.port if node.port != DEFAULT_PORT else None)
    if node.identity_file is not None:
        target = Hop(target.name, target.host, target.port, target.user, node.identity_file)
    found = config.lookup(node.host) if config is not None else paramiko.SSHConfigDict()
    chain = str(found.get("proxyjump", "")).strip()
    if not chain or chain.lower() == "none":
        return Route(target)
    return Route(target, [_jump(config, entry.strip()) for entry in chain.split(",") if entry])


def rendezvous_host(node: NodeSpec, ssh: SSHSpec) -> str:
    """The address the other nodes reach ``node`` by (``MASTER_ADDR`` for the first,
    the memory tier's replica peers): an ssh node's ``HostName`` when its ``host`` is
    an alias of ``ssh.config``, else its ``host``. A jump host is only the
    controller's way in; the ranks talk to each other directly."""
    if node.launcher != "ssh":
        return node.host
    try:
        return route(node, ssh).target.host
    except SSHConfigError:
        return node.host
