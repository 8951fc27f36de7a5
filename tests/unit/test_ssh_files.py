"""The SSH files a spec names resolve under a directory the worker allows (issue 37,
N13). ``ssh.known_hosts`` and ``identity_file`` come from the workflow input, and the
worker reads the identity file and, with ``ssh.accept_new_host_keys``, appends a
``host keytype key`` line to ``known_hosts``, wherever it points: a shell rc file,
``authorized_keys``. No sshd here: paramiko's ``connect`` is replaced by one that
offers a new host key to the agent's policy, as a real server's first answer does."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import paramiko
import pytest

from activities.nodes.agent import NodeRefused
from activities.nodes.ssh.agent import SSHAgent
from activities.nodes.ssh.files import (
    DEFAULT_SSH_DIRS,
    SSH_DIRS_ENV,
    SSHDirsError,
    allowed_ssh_dirs,
    ssh_file_problem,
)
from lazarus.domain.spec import NodeSpec, SSHSpec

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home of its own, with the default rule: only ``~/.ssh`` is allowed."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(SSH_DIRS_ENV, raising=False)
    (tmp_path / ".ssh").mkdir(mode=0o700)
    (tmp_path / ".bashrc").write_text("export PATH=$HOME/bin:$PATH\n")
    return tmp_path


def offer_a_new_host_key(client: paramiko.SSHClient, hostname: str, **_: Any) -> None:
    """What ``connect`` does with a server whose key is unknown: ask the policy."""
    key = paramiko.RSAKey.generate(1024)
    client._policy.missing_host_key(client, hostname, key)  # type: ignore[attr-defined]
    raise paramiko.SSHException("no server here: the test stops after the host key")


def test_a_known_hosts_outside_the_ssh_directory_is_never_appended_to(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(paramiko.SSHClient, "connect", offer_a_new_host_key)
    before = (home / ".bashrc").read_text()
    agent = SSHAgent(
        NodeSpec(name="h1", launcher="ssh", host="10.0.0.1"),
        SSHSpec(known_hosts="~/.bashrc", accept_new_host_keys=True, use_agent=True),
    )
    with pytest.raises(NodeRefused) as refused:
        agent._connect()
    message = str(refused.value)
    assert "ssh.known_hosts ~/.bashrc" in message and SSH_DIRS_ENV in message, message
    assert "outside the directories this worker allows" in message
    assert (home / ".bashrc").read_text() == before, "the worker wrote into ~/.bashrc"


def test_an_identity_file_outside_is_never_read(home: Path) -> None:
    agent = SSHAgent(
        NodeSpec(name="h1", launcher="ssh", host="10.0.0.1", identity_file="/etc/passwd"),
        SSHSpec(),
    )
    with pytest.raises(NodeRefused, match=r"identity_file /etc/passwd is outside"):
        agent._connect()


def test_files_inside_pass_and_a_new_known_hosts_is_created_there(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(paramiko.SSHClient, "connect", offer_a_new_host_key)
    agent = SSHAgent(
        NodeSpec(name="h1", launcher="ssh", host="10.0.0.1"),
        SSHSpec(known_hosts="~/.ssh/known_hosts", accept_new_host_keys=True),
    )
    with pytest.raises(Exception, match="no server here"):
        agent._connect()
    assert (home / ".ssh" / "known_hosts").read_text().startswith("10.0.0.1 ssh-rsa ")


def test_a_symlink_out_of_the_directory_is_outside(home: Path) -> None:
    link = home / ".ssh" / "known_hosts"
    link.symlink_to(home / ".bashrc")
    problem = ssh_file_problem("ssh.known_hosts", str(link), DEFAULT_SSH_DIRS)
    assert problem is not None and f"(resolved: {home / '.bashrc'})" in problem
    assert ssh_file_problem("ssh.known_hosts", "~/.ssh/../.bashrc", DEFAULT_SSH_DIRS)


def test_a_relative_path_is_refused(home: Path) -> None:
    problem = ssh_file_problem("identity_file", "id_ed25519", DEFAULT_SSH_DIRS)
    assert problem is not None and "not an absolute path" in problem


def test_the_worker_widens_the_directories_in_its_own_environment(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    dirs = allowed_ssh_dirs({SSH_DIRS_ENV: f"~/.ssh{os.pathsep}{keys}"})
    assert dirs == ("~/.ssh", str(keys))
    assert ssh_file_problem("identity_file", str(keys / "id"), dirs) is None
    assert allowed_ssh_dirs({}) == DEFAULT_SSH_DIRS == allowed_ssh_dirs({SSH_DIRS_ENV: " "})
    with pytest.raises(SSHDirsError, match="'keys' is not an absolute path"):
        allowed_ssh_dirs({SSH_DIRS_ENV: "keys"})
