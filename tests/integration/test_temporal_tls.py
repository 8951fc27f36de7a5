"""The security model's TLS half, against a real server: ``lazarus.app.settings.connect`` with
the ``TEMPORAL_TLS_*`` settings verifies the frontend's certificate, refuses one signed by
another CA, and presents its client certificate (mTLS).

The dev server cannot serve TLS itself (``temporal server start-dev`` has no TLS flags),
so a TLS-terminating proxy on loopback (``tls_proxy.py``) plays the TLS frontend; the
certificates come from ``deploy/compose/make-test-ca.sh``, the script the Compose stack
uses. What this does not exercise: Temporal's own TLS listener (Go's crypto/tls rather
than OpenSSL), and SNI/hostname overrides, which ``ConnectionSettings`` does not expose.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from lazarus.app.devserver import DevServer
from lazarus.app.settings import ConnectionSettings, ServerUnreachable, connect
from tests.integration.tls_proxy import TLSTerminatingProxy
from workers.controller import ensure_search_attributes

REPO = Path(__file__).resolve().parents[2]
MAKE_TEST_CA = REPO / "deploy" / "compose" / "make-test-ca.sh"

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed"),
]


def _make_ca(out: Path) -> Path:
    subprocess.run(["bash", str(MAKE_TEST_CA), str(out)], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CA the frontend's certificate is signed by, as the Compose stack makes it."""
    return _make_ca(tmp_path_factory.mktemp("pki") / "certs")


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An unrelated CA with the same names: the wrong one to trust."""
    return _make_ca(tmp_path_factory.mktemp("other-pki") / "certs")


def _settings(address: str, ca: Path, cert: Path | None, key: Path | None) -> ConnectionSettings:
    """Through the environment variables an operator sets, not the constructor."""
    env = {"TEMPORAL_TLS_CA": str(ca)}
    if cert is not None and key is not None:
        env |= {"TEMPORAL_TLS_CERT": str(cert), "TEMPORAL_TLS_KEY": str(key)}
    return ConnectionSettings.from_env(env, address=address)


def _chain(exc: BaseException) -> str:
    parts = []
    current: BaseException | None = exc
    while current is not None:
        parts.append(str(current))
        current = current.__cause__ or current.__context__
    return " | ".join(parts)


async def test_mtls_connects_and_the_server_sees_the_worker_certificate(
    dev_server: DevServer, pki: Path
) -> None:
    async with TLSTerminatingProxy(
        dev_server.address, pki / "server.pem", pki / "server.key", client_ca=pki / "ca.pem"
    ) as proxy:
        settings = _settings(proxy.address, pki / "ca.pem", pki / "worker.pem", pki / "worker.key")
        assert settings.tls
        client = await connect(settings)
        # A real RPC of each kind the worker makes at start, all through TLS.
        await ensure_search_attributes(client, settings.namespace)
        await client.count_workflows()
        assert "lazarus-worker" in proxy.log.peers, proxy.log
        assert not proxy.log.failures, proxy.log
        assert proxy.log.bytes_to_backend > 0


async def test_server_certificate_from_another_ca_is_rejected(
    dev_server: DevServer, pki: Path, other_pki: Path
) -> None:
    async with TLSTerminatingProxy(
        dev_server.address, pki / "server.pem", pki / "server.key"
    ) as proxy:
        settings = _settings(proxy.address, other_pki / "ca.pem", None, None)
        with pytest.raises(ServerUnreachable) as refused:
            await connect(settings)
        # The client refused the handshake itself: nothing reached the server.
        assert proxy.log.failures, proxy.log
        assert proxy.log.peers == []
        assert proxy.log.bytes_to_backend == 0
        assert (
            "certificate" in _chain(refused.value).lower()
            or "unknown" in _chain(refused.value).lower()
        ), _chain(refused.value)


async def test_the_right_ca_alone_is_enough_without_client_auth(
    dev_server: DevServer, pki: Path
) -> None:
    """Server-only TLS (API-key or Cloud-style frontends): verify it, present nothing."""
    async with TLSTerminatingProxy(
        dev_server.address, pki / "server.pem", pki / "server.key"
    ) as proxy:
        client = await connect(_settings(proxy.address, pki / "ca.pem", None, None))
        await client.count_workflows()
        assert proxy.log.peers and proxy.log.peers[0] == ""


async def test_frontend_requiring_mtls_refuses_a_client_without_certificate(
    dev_server: DevServer, pki: Path
) -> None:
    async with TLSTerminatingProxy(
        dev_server.address, pki / "server.pem", pki / "server.key", client_ca=pki / "ca.pem"
    ) as proxy:
        with pytest.raises(ServerUnreachable):
            await connect(_settings(proxy.address, pki / "ca.pem", None, None))
        assert proxy.log.failures, proxy.log
        assert proxy.log.bytes_to_backend == 0


async def test_frontend_refuses_a_client_certificate_from_another_ca(
    dev_server: DevServer, pki: Path, other_pki: Path
) -> None:
    async with TLSTerminatingProxy(
        dev_server.address, pki / "server.pem", pki / "server.key", client_ca=pki / "ca.pem"
    ) as proxy:
        settings = _settings(
            proxy.address, pki / "ca.pem", other_pki / "worker.pem", other_pki / "worker.key"
        )
        with pytest.raises(ServerUnreachable):
            await connect(settings)
        assert proxy.log.failures, proxy.log
        assert proxy.log.bytes_to_backend == 0


async def test_plaintext_client_cannot_talk_to_a_tls_frontend(
    dev_server: DevServer, pki: Path
) -> None:
    async with TLSTerminatingProxy(
        dev_server.address, pki / "server.pem", pki / "server.key"
    ) as proxy:
        with pytest.raises(ServerUnreachable):
            await connect(ConnectionSettings(address=proxy.address), timeout_s=3.0)
        assert proxy.log.bytes_to_backend == 0
