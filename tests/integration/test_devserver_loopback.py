"""A running dev server listens on 127.0.0.1 only: frontend, Web UI, HTTP API, metrics.

Checked from the kernel's socket tables, not from the flags: a CLI upgrade that
added a listener on all interfaces would show up here.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import pytest

from lazarus.app.devserver import DevServer

LISTEN = "0A"


def _socket_inodes(pgid: int) -> set[str]:
    inodes: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) != pgid:
                continue
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
        except OSError:
            continue
    return inodes


def _address(hex_ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_ip)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])
    # /proc/net/tcp6 prints four host-order 32-bit words.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return ipaddress.IPv6Address(words)


def listening(pgid: int) -> list[tuple[str, int]]:
    inodes = _socket_inodes(pgid)
    found = []
    for table in ("tcp", "tcp6"):
        path = Path("/proc/net") / table
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN and fields[9] in inodes:
                hex_ip, hex_port = fields[1].split(":")
                found.append((str(_address(hex_ip)), int(hex_port, 16)))
    return found


@pytest.mark.timeout(120)
def test_dev_server_listens_on_loopback_only(tmp_path: Path) -> None:
    server = DevServer(tmp_path / "server", headless=False)
    server.start()
    try:
        assert server.pid is not None
        sockets = listening(server.pid)
    finally:
        server.stop()
    ports = {port for _, port in sockets}
    assert {server.port, server.ui_port} <= ports, sockets
    exposed = [(ip, port) for ip, port in sockets if not ipaddress.ip_address(ip).is_loopback]
    assert not exposed, f"the dev server listens beyond loopback: {exposed}"
