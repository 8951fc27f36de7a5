"""Defect 19 (issue 10): a slow answer on a live SSH connection keeps the connection.

Dropping it made the next poll pay a full key exchange on the same loaded machine,
which timed out as well, so a healthy node failed poll after poll and was declared
lost. A dead transport is still dropped. Fakes stand in for paramiko: what is
checked is only which connection the agent keeps.
"""

from __future__ import annotations

import pytest

from activities.nodes.agent import NodeUnreachable
from activities.nodes.ssh.agent import SSHAgent
from lazarus.domain.spec import NodeSpec, SSHSpec


class SlowChannel:
    def __init__(self) -> None:
        self.closed = False

    def set_combine_stderr(self, combine: bool) -> None:
        pass

    def exec_command(self, command: str) -> None:
        pass

    def sendall(self, data: bytes) -> None:
        pass

    def shutdown_write(self) -> None:
        pass

    def settimeout(self, timeout: float) -> None:
        pass

    def recv(self, size: int) -> bytes:
        raise TimeoutError  # what socket.timeout is: the answer did not come in time

    def close(self) -> None:
        self.closed = True


class FakeTransport:
    def __init__(self, active: bool) -> None:
        self.active = active

    def open_session(self, timeout: float) -> SlowChannel:
        return SlowChannel()

    def is_active(self) -> bool:
        return self.active

    def close(self) -> None:
        self.active = False


class FakeClient:
    def __init__(self, transport: FakeTransport) -> None:
        self.transport = transport
        self.closed = False

    def get_transport(self) -> FakeTransport:
        return self.transport

    def close(self) -> None:
        self.closed = True


def agent_with(transport: FakeTransport) -> tuple[SSHAgent, FakeClient]:
    agent = SSHAgent(NodeSpec(name="h1", launcher="ssh", host="10.0.0.1"), SSHSpec())
    client = FakeClient(transport)
    agent._client = client  # type: ignore[assignment]
    return agent, client


def test_a_slow_answer_keeps_a_live_connection() -> None:
    agent, client = agent_with(FakeTransport(active=True))
    with pytest.raises(NodeUnreachable, match="no answer within"):
        agent._run(b"true\n", 0.05)
    kept: object = agent._client
    assert kept is client and not client.closed


def test_a_dead_transport_is_dropped_after_a_timeout() -> None:
    transport = FakeTransport(active=True)
    agent, client = agent_with(transport)
    original = transport.open_session

    def dies(timeout: float) -> SlowChannel:
        transport.active = False  # the link died while we waited
        return original(timeout)

    transport.open_session = dies  # type: ignore[method-assign]
    with pytest.raises(NodeUnreachable):
        agent._run(b"true\n", 0.05)
    assert agent._client is None and client.closed
