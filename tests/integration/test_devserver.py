"""The embedded dev server: ready means usable, restart keeps state, stop leaves nothing.

Tests, the bench and ``make demo`` all lean on :class:`DevServer`; a server that
reports ready before its search attributes exist, or a stop that leaks a process,
would show up there as flaky failures far from the cause.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client, WorkflowExecutionStatus

from lazarus.app.devserver import DevServer
from lazarus.app.settings import ConnectionSettings, connect
from lazarus.domain.api import SEARCH_ATTRIBUTES


@pytest.fixture
def dev_server(tmp_path: Path) -> Iterator[DevServer]:
    server = DevServer(tmp_path / "server", headless=True)
    try:
        server.start()
        yield server
    finally:
        server.stop()


async def _client(server: DevServer) -> Client:
    return await connect(ConnectionSettings(address=server.address))


async def _search_attributes(client: Client) -> dict[str, int]:
    response = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    return dict(response.custom_attributes)


def _gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)  # the server led its own group: nothing of it may remain
    except ProcessLookupError:
        return True
    return False


async def test_dev_server_registers_restarts_and_stops(dev_server: DevServer) -> None:
    client = await _client(dev_server)
    registered = await _search_attributes(client)
    for key in SEARCH_ATTRIBUTES:
        assert registered.get(key.name) == IndexedValueType.ValueType(int(key.indexed_value_type))

    # A workflow started before the restart must still be there after it: the
    # sqlite file is what lets jobs outlive a server restart.
    handle = await client.start_workflow(
        "NoSuchWorkflowType", id="devserver-survives-restart", task_queue="no-worker-here"
    )
    first_pid = dev_server.pid
    assert first_pid is not None

    dev_server.restart()

    assert _gone(first_pid)
    assert dev_server.running and dev_server.pid != first_pid
    client = await _client(dev_server)
    assert {key.name for key in SEARCH_ATTRIBUTES} <= set(await _search_attributes(client))
    described = await client.get_workflow_handle(handle.id).describe()
    assert described.status == WorkflowExecutionStatus.RUNNING
    await client.get_workflow_handle(handle.id).terminate("test done")

    second_pid = dev_server.pid
    assert second_pid is not None
    dev_server.stop()
    assert not dev_server.running
    assert _gone(second_pid)
    dev_server.stop()  # idempotent


def test_state_files_live_in_the_state_dir(dev_server: DevServer) -> None:
    assert (dev_server.state_dir / "temporal.sqlite").is_file()
    assert dev_server.log_path.is_file()
    assert dev_server.ui_url is None  # headless


async def test_a_database_from_an_older_lazarus_gets_the_new_search_attributes(
    tmp_path: Path,
) -> None:
    """The start flags register search attributes only in a fresh database; a state
    directory kept from an older Lazarus (``make demo`` run before an upgrade) lacks
    the newer ones, and the server must not be reported unusable for it."""
    from temporalio.api.operatorservice.v1 import RemoveSearchAttributesRequest

    newest = SEARCH_ATTRIBUTES[-1].name
    server = DevServer(tmp_path / "server", headless=True)
    try:
        server.start()
        client = await _client(server)
        await client.operator_service.remove_search_attributes(
            RemoveSearchAttributesRequest(namespace=client.namespace, search_attributes=[newest])
        )
        assert newest not in await _search_attributes(client)
        server.stop()
        server.start()  # the same sqlite file, as an upgraded user's
        assert newest in await _search_attributes(await _client(server))
    finally:
        server.stop()


@pytest.mark.timeout(120)
def test_a_port_taken_before_the_server_binds_it_is_replaced(tmp_path: Path) -> None:
    """Four test workers each start a server: a port chosen free was once taken
    before the server bound it, and every test of that worker failed."""
    server = DevServer(tmp_path / "state", headless=True)
    with socket.socket() as squatter:
        squatter.bind((server.ip, 0))
        squatter.listen()
        server.port = squatter.getsockname()[1]  # as if another process took it first
        taken = server.port
        server.start()
        try:
            assert server.running and server.port != taken
            assert "address already in use" in server.log_path.read_text()
        finally:
            server.stop()
