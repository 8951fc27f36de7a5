"""The embedded dev server binds to loopback only (issue 10, defect 14).

It has no authentication, and a workflow input is a command the worker runs: reachable
from the network, it would run anyone's commands as the worker's user.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lazarus.app.devserver import DevServer, DevServerError, dev_server_command


def test_command_binds_the_frontend_and_the_ui_to_loopback(tmp_path: Path) -> None:
    command = dev_server_command(17233, 18233, tmp_path)
    assert command[command.index("--ip") + 1] == "127.0.0.1"
    assert command[command.index("--ui-ip") + 1] == "127.0.0.1"
    assert command[command.index("--ui-ip") + 1] == command[command.index("--ip") + 1]
    for loopback in ("::1", "localhost", "127.0.0.2"):
        assert loopback in dev_server_command(17233, 18233, tmp_path, ip=loopback)


@pytest.mark.parametrize("ip", ["0.0.0.0", "::", "10.1.2.3", "example.org", ""])
def test_other_addresses_are_refused_with_the_reason(tmp_path: Path, ip: str) -> None:
    with pytest.raises(DevServerError, match="no authentication") as caught:
        dev_server_command(17233, 18233, tmp_path, ip=ip)
    assert "mTLS or an API key" in str(caught.value)
    with pytest.raises(DevServerError):
        DevServer(tmp_path, ip=ip)
