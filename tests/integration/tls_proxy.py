"""A TLS-terminating proxy on loopback, standing in for a TLS-enabled Temporal frontend.

``temporal server start-dev`` has no TLS options, so the TLS tests put this in front of
it: the proxy presents a server certificate, optionally requires a client certificate
signed by a given CA (mTLS, as a production frontend with ``requireClientAuth`` does),
and only after a completed handshake relays bytes to the dev server's plain gRPC port.

It records what happened, so a test can tell *who* refused a connection: the handshakes
that completed (with the client certificate's subject), the ones that failed (with the
reason OpenSSL gave) and how many bytes ever reached the dev server.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

HANDSHAKE_TIMEOUT_S = 10.0


@dataclass
class ProxyLog:
    peers: list[str] = field(default_factory=list)
    """One entry per completed handshake: the client certificate's subject CN ('' if none)."""
    failures: list[str] = field(default_factory=list)
    """One entry per failed handshake: OpenSSL's reason."""
    bytes_to_backend: int = 0


class TLSTerminatingProxy:
    def __init__(
        self,
        backend: str,
        cert: Path,
        key: Path,
        client_ca: Path | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        backend_host, _, backend_port = backend.rpartition(":")
        self._backend = (backend_host, int(backend_port))
        self._host = host
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._context.load_cert_chain(cert, key)
        # gRPC clients (the SDK's Rust core) negotiate HTTP/2 by ALPN.
        self._context.set_alpn_protocols(["h2"])
        if client_ca is not None:
            self._context.load_verify_locations(client_ca)
            self._context.verify_mode = ssl.CERT_REQUIRED
        self.log = ProxyLog()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        assert self._server is not None, "start() the proxy first"
        port = self._server.sockets[0].getsockname()[1]
        return f"{self._host}:{port}"

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accept, self._host, 0)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await writer.start_tls(self._context, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
        except (ssl.SSLError, ConnectionError, TimeoutError) as exc:
            self.log.failures.append(getattr(exc, "reason", None) or str(exc))
            return
        self.log.peers.append(_common_name(writer.get_extra_info("peercert")))
        backend_reader, backend_writer = await asyncio.open_connection(*self._backend)
        try:
            await asyncio.gather(
                self._pipe(reader, backend_writer, to_backend=True),
                self._pipe(backend_reader, writer, to_backend=False),
            )
        finally:
            backend_writer.close()
            with contextlib.suppress(Exception):
                await backend_writer.wait_closed()

    async def _pipe(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, to_backend: bool
    ) -> None:
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            while chunk := await source.read(65536):
                if to_backend:
                    self.log.bytes_to_backend += len(chunk)
                sink.write(chunk)
                await sink.drain()
        with contextlib.suppress(Exception):
            sink.close()


def _common_name(peercert: object) -> str:
    if not isinstance(peercert, dict):
        return ""
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""
