"""Where the Temporal server is and how to reach it, and the one place that connects.

Settings hold *paths* to TLS material, never the material itself, and the API key
is excluded from repr and serialisation: these models may be logged or passed
into places that end up in workflow history. Files are read only at connect time.

Every client (CLI, worker, tests, bench) connects through :func:`connect`, so they
all share the pydantic data converter the workflow's models need, and a server
that is not there is reported the same way everywhere: one line that says what to do.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.envconfig import ClientConfigProfile
from temporalio.service import TLSConfig

from lazarus.domain.api import API_KEY_ENV, DEFAULT_TASK_QUEUE

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_NAMESPACE = "default"
CONNECT_TIMEOUT_S = 5.0
"""A CLI command against a missing server must fail in seconds, not hang."""

# Each setting reads the first variable that is set. The short names come first; the
# long ones are what the ``temporal`` CLI itself reads, so one shell setup serves both.
_ENV_NAMES: dict[str, tuple[str, ...]] = {
    "address": ("TEMPORAL_ADDRESS",),
    "namespace": ("TEMPORAL_NAMESPACE",),
    "task_queue": ("LAZARUS_TASK_QUEUE",),
    "tls_cert_path": ("TEMPORAL_TLS_CERT", "TEMPORAL_TLS_CLIENT_CERT_PATH"),
    "tls_key_path": ("TEMPORAL_TLS_KEY", "TEMPORAL_TLS_CLIENT_KEY_PATH"),
    "tls_ca_path": ("TEMPORAL_TLS_CA", "TEMPORAL_TLS_SERVER_CA_CERT_PATH"),
}
UI_URL_ENV = "LAZARUS_UI_URL"
_TRUTHY = frozenset({"1", "true", "yes", "on"})


class ConnectionProblem(Exception):
    """Connecting cannot work as configured; the message is one line meant for a person."""


class ServerUnreachable(ConnectionProblem):
    def __init__(self, address: str) -> None:
        super().__init__(
            f"cannot reach Temporal at {address}: run 'lazarus server' (or set TEMPORAL_ADDRESS)"
        )
        self.address = address


class TLSFileUnreadable(ConnectionProblem):
    pass


class ConnectionSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    address: str = DEFAULT_ADDRESS
    namespace: str = DEFAULT_NAMESPACE
    task_queue: str = DEFAULT_TASK_QUEUE
    tls: bool = False
    """Turned on by any TLS path or an API key too, as the ``temporal`` CLI does."""
    tls_cert_path: Path | None = None
    tls_key_path: Path | None = None
    tls_ca_path: Path | None = None
    api_key: SecretStr | None = Field(default=None, repr=False, exclude=True)
    """Filled by :meth:`from_env` only (``TEMPORAL_API_KEY`` or the ``temporal`` CLI's
    profile); never serialised."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> ConnectionSettings:
        """Settings from the usual Temporal variables; ``None`` overrides are ignored so
        that unset CLI options fall through to the environment."""
        source = os.environ if env is None else env
        values: dict[str, Any] = _profile_values(source)
        for field, names in _ENV_NAMES.items():
            for name in names:
                if source.get(name):
                    values[field] = source[name]
                    break
        if source.get("TEMPORAL_TLS", "").strip().lower() in _TRUTHY:
            values["tls"] = True
        if "api_key" in overrides:
            raise TypeError(f"the API key is read only from {API_KEY_ENV}")
        values.update({key: value for key, value in overrides.items() if value is not None})
        if source.get(API_KEY_ENV):
            values["api_key"] = SecretStr(source[API_KEY_ENV])
        if values.get("api_key") or any(
            values.get(f) for f in ("tls_cert_path", "tls_key_path", "tls_ca_path")
        ):
            values["tls"] = True
        return cls(**values)

    def tls_config(self) -> TLSConfig | bool:
        """Read the TLS files now (not when the settings were made), so rotated
        certificates are picked up by the next connection."""
        if not self.tls:
            return False
        if (self.tls_cert_path is None) != (self.tls_key_path is None):
            raise TLSFileUnreadable(
                "TLS client auth needs both TEMPORAL_TLS_CERT and TEMPORAL_TLS_KEY"
            )
        if self.tls_cert_path is None and self.tls_ca_path is None:
            return True
        return TLSConfig(
            server_root_ca_cert=_read(self.tls_ca_path, "TLS CA certificate"),
            client_cert=_read(self.tls_cert_path, "TLS client certificate"),
            client_private_key=_read(self.tls_key_path, "TLS client key"),
        )


def _profile_values(env: Mapping[str, str]) -> dict[str, Any]:
    """The ``temporal`` CLI's own profile (``temporal config``): the TOML file at
    ``TEMPORAL_CONFIG_FILE`` or ``~/.config/temporalio/temporal.toml``, profile
    ``TEMPORAL_PROFILE`` or ``default``, so one ``temporal config set`` serves both
    tools. The environment overrides it (read after this, as the CLI does).

    TLS material must be named by path (``client_cert_path``...): settings hold paths
    only and read them at connect time. A profile with inline PEM data is refused with
    that advice rather than copied into a model that may be logged."""
    try:
        profile = ClientConfigProfile.load(
            env.get("TEMPORAL_PROFILE") or None, override_env_vars=dict(env)
        )
    except Exception as exc:  # the bridge's ConfigError: a bad file or an unknown profile
        raise ConnectionProblem(f"temporal config profile: {exc}") from None
    values: dict[str, Any] = {}
    if profile.address:
        values["address"] = profile.address
    if profile.namespace:
        values["namespace"] = profile.namespace
    if profile.api_key:
        values["api_key"] = SecretStr(profile.api_key)
    tls = profile.tls
    if tls is not None and not tls.disabled:
        values["tls"] = True
        for field, source, name in (
            ("tls_cert_path", tls.client_cert, "client_cert"),
            ("tls_key_path", tls.client_private_key, "client_key"),
            ("tls_ca_path", tls.server_root_ca_cert, "server_ca_cert"),
        ):
            if isinstance(source, Path):
                values[field] = source
            elif source is not None:
                raise ConnectionProblem(
                    f"temporal config profile: tls {name}_data is inline; Lazarus reads TLS "
                    f"material from files at connect time: set {name}_path instead"
                )
    return values


def _read(path: Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.expanduser().read_bytes()
    except OSError as exc:
        raise TLSFileUnreadable(
            f"cannot read the {what} at {path}: {exc.strerror or exc}"
        ) from None


async def connect(settings: ConnectionSettings, timeout_s: float = CONNECT_TIMEOUT_S) -> Client:
    """Connect with the pydantic converter, or raise :class:`ServerUnreachable`."""
    tls = settings.tls_config()
    api_key = settings.api_key.get_secret_value() if settings.api_key else None
    try:
        return await asyncio.wait_for(
            Client.connect(
                settings.address,
                namespace=settings.namespace,
                api_key=api_key,
                tls=tls,
                data_converter=pydantic_data_converter,
                connect_timeout=timedelta(seconds=timeout_s),
            ),
            timeout=timeout_s + 1.0,
        )
    except (RuntimeError, TimeoutError, OSError) as exc:
        raise ServerUnreachable(settings.address) from exc


def web_ui_url(settings: ConnectionSettings, workflow_id: str | None = None) -> str | None:
    """Where a person can look at the job; ``None`` when we cannot guess the UI.

    A dev server serves its UI on the gRPC port + 1000 (``temporal server
    start-dev``'s default); anything else needs ``LAZARUS_UI_URL``.
    """
    base = os.environ.get(UI_URL_ENV, "").rstrip("/") or _guess_ui_base(settings.address)
    if base is None:
        return None
    url = f"{base}/namespaces/{quote(settings.namespace, safe='')}/workflows"
    if workflow_id is not None:
        url += f"/{quote(workflow_id, safe='')}"
    return url


def _guess_ui_base(address: str) -> str | None:
    host, _, port = address.rpartition(":")
    if host.endswith(".tmprl.cloud"):
        return "https://cloud.temporal.io"
    if host.strip("[]") not in ("localhost", "127.0.0.1", "::1", "0.0.0.0") or not port.isdigit():
        return None
    return f"http://localhost:{int(port) + 1000}"
