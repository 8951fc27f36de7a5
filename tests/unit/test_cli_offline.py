"""The CLI's behaviour when no server is involved, or none is reachable.

These are the paths a new user hits first (a typo in the spec, no server
running), so they must be fast, exact and free of tracebacks.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from lazarus.app import cli, cli_render
from lazarus.app.devserver import dev_server_command
from lazarus.app.settings import ConnectionProblem, ConnectionSettings, web_ui_url
from lazarus.domain.contracts import RankStatus, SupervisionProgress
from lazarus.domain.ports import free_port
from workflows.state import Incident, JobStatus, Phase

GOOD_SPEC = """\
name: tiny
command: [python, train.py]
nproc_per_node: 2
checkpoint_dir: ckpt
env: {FOO: bar}
"""

BAD_SPEC = """\
name: Not A Name
command: []
nproc_per_node: 0
checkpoint_dir: ckpt
colour: red
"""

_TEMPORAL_ENV = (
    "TEMPORAL_ADDRESS",
    "TEMPORAL_NAMESPACE",
    "TEMPORAL_API_KEY",
    "TEMPORAL_TLS",
    "TEMPORAL_TLS_CERT",
    "TEMPORAL_TLS_KEY",
    "TEMPORAL_TLS_CA",
    "TEMPORAL_TLS_CLIENT_CERT_PATH",
    "TEMPORAL_TLS_CLIENT_KEY_PATH",
    "TEMPORAL_TLS_SERVER_CA_CERT_PATH",
    "LAZARUS_TASK_QUEUE",
    "LAZARUS_UI_URL",
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own Temporal settings must not leak into these tests."""
    for name in _TEMPORAL_ENV:
        monkeypatch.delenv(name, raising=False)


def _write(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_bad_spec_exits_2_with_field_lines(tmp_path: Path, no_server: list[Any]) -> None:
    spec = _write(tmp_path, BAD_SPEC)
    result = CliRunner().invoke(cli.app, ["start", str(spec)])

    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert lines, "expected error lines on stderr"
    assert all(line.startswith(f"{spec}: ") for line in lines), lines
    fields = {line.split(": ")[1] for line in lines}
    assert {"name", "command", "nproc_per_node", "colour"} <= fields
    assert "Traceback" not in result.output
    assert result.stdout == ""
    assert no_server == []


def test_missing_spec_file_exits_2(tmp_path: Path, no_server: list[Any]) -> None:
    result = CliRunner().invoke(cli.app, ["start", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "cannot read the file" in result.stderr
    assert no_server == []


def test_dry_run_shows_the_workers_plan(tmp_path: Path, worker_here: list[Any]) -> None:
    """The plan of the nodes and ranks is the worker's (issue 40): one call, nothing
    started (``worker_here`` fails a start)."""
    spec = _write(tmp_path, GOOD_SPEC)
    result = CliRunner().invoke(cli.app, ["start", str(spec), "--dry-run"], env={"COLUMNS": "160"})

    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "lazarus-tiny" in out
    assert "world size" in out and "2 (1 node x 2 proc)" in out
    assert "lazarus" in out  # the default task queue
    assert str(tmp_path / "ckpt") in out  # paths are shown resolved
    assert "MASTER_ADDR" in out and "LAZARUS_JOB_ID" in out
    assert [r.kind for r in worker_here] == ["start_checks"]


def test_dry_run_json_honours_name_and_task_queue(tmp_path: Path, worker_here: list[Any]) -> None:
    spec = _write(tmp_path, GOOD_SPEC)
    result = CliRunner().invoke(
        cli.app,
        ["start", str(spec), "--dry-run", "--json", "--name", "tiny-2"],
        env={"LAZARUS_TASK_QUEUE": "gpu-box"},
    )

    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["workflow_id"] == "lazarus-tiny-2"
    assert plan["task_queue"] == "gpu-box"
    assert plan["world_size"] == 2
    assert plan["spec"]["name"] == "tiny-2"
    assert [rank["RANK"] for rank in plan["ranks"]] == ["0", "1"]
    assert {rank["WORLD_SIZE"] for rank in plan["ranks"]} == {"2"}
    assert plan["ranks"][1]["LOCAL_RANK"] == "1"
    assert plan["ranks"][0]["FOO"] == "bar"


@pytest.mark.parametrize(
    "args",
    [["status", "some-job"], ["list"], ["cancel", "some-job"], ["start", "SPEC"]],
)
def test_unreachable_server_gives_one_line_hint_fast(tmp_path: Path, args: list[str]) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    spec = _write(tmp_path, GOOD_SPEC)
    args = [str(spec) if arg == "SPEC" else arg for arg in args]

    began = time.monotonic()
    result = CliRunner().invoke(cli.app, args, env={"TEMPORAL_ADDRESS": address})
    took = time.monotonic() - began

    assert result.exit_code == 1, result.output
    assert result.stderr.strip() == (
        f"cannot reach Temporal at {address}: run 'lazarus server' (or set TEMPORAL_ADDRESS)"
    )
    assert "Traceback" not in result.output
    assert took < 10, f"took {took:.1f}s to notice there is no server"


def test_address_option_beats_environment(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    result = CliRunner().invoke(
        cli.app, ["--address", address, "list"], env={"TEMPORAL_ADDRESS": "elsewhere:1"}
    )
    assert result.exit_code == 1
    assert f"cannot reach Temporal at {address}:" in result.stderr


def _status(**overrides: Any) -> JobStatus:
    fields: dict[str, Any] = dict(
        job_id="tiny",
        phase=Phase.RECOVERING,
        generation=2,
        step=120,
        world_size=2,
        ranks=[
            RankStatus(rank=0, pid=100, alive=True, step=120, last_progress_at=1000.0),
            RankStatus(rank=1, pid=101, alive=False, exit_code=None, signal="SIGKILL"),
        ],
        restarts=1,
        max_restarts=5,
        incidents=[
            Incident(
                id=1,
                generation=1,
                kind="crash",
                failure_class="killed",
                rank=1,
                signal="SIGKILL",
                fault_at=990.0,
                detected_at=990.4,
                detection_s=0.4,
                step_at_failure=118,
                resumed_from_step=100,
                steps_lost=18,
                recovery_s=7.5,
                action="restart",
                reason="rank 1 was killed",
            )
        ],
        ettr=0.875,
        elapsed_s=3723.0,
    )
    fields.update(overrides)
    return JobStatus(**fields)


def test_status_json_rendering() -> None:
    view = cli_render.StatusView(
        workflow_id="lazarus-tiny", execution_status="RUNNING", status=_status()
    )
    body = json.loads(json.dumps(cli_render.status_json(view)))

    assert body["phase"] == "RECOVERING"
    assert body["generation"] == 2
    assert body["step"] == 120
    assert body["ettr"] == 0.875
    assert body["workflow_id"] == "lazarus-tiny"
    assert body["workflow_status"] == "RUNNING"
    (incident,) = body["incidents"]
    assert incident["class"] == "killed"
    assert "failure_class" not in incident
    assert incident["rank"] == 1
    assert incident["detection_s"] == 0.4
    assert incident["recovery_s"] == 7.5
    assert incident["steps_lost"] == 18
    # What a script reads back must round-trip into the model.
    assert Incident.model_validate(incident).failure_class == "killed"


def test_status_json_prefers_newer_live_step_of_current_generation() -> None:
    def live(generation: int, step: int) -> SupervisionProgress:
        return SupervisionProgress(
            generation=generation, step=step, alive=2, world_size=2, observed_at=1.0
        )

    status = _status(phase=Phase.RUNNING)
    newer = cli_render.StatusView("lazarus-tiny", "RUNNING", status=status, live=live(2, 150))
    stale = cli_render.StatusView("lazarus-tiny", "RUNNING", status=status, live=live(1, 400))
    behind = cli_render.StatusView("lazarus-tiny", "RUNNING", status=status, live=live(2, 90))

    assert cli_render.status_json(newer)["step"] == 150
    assert cli_render.status_json(newer)["live"]["step"] == 150
    assert cli_render.status_json(stale)["step"] == 120
    assert cli_render.status_json(behind)["step"] == 120


def test_status_json_without_a_query_answer_keeps_the_keys() -> None:
    view = cli_render.StatusView(
        workflow_id="lazarus-tiny",
        execution_status="RUNNING",
        phase_hint="RUNNING",
        step_hint=40,
        note="no worker answered",
    )
    body = cli_render.status_json(view)
    assert body["job_id"] == "tiny"
    assert body["phase"] == "RUNNING"
    assert body["step"] == 40
    assert body["generation"] is None and body["ettr"] is None
    assert body["incidents"] == []
    assert body["note"] == "no worker answered"


def test_status_rendering_shows_operator_advice() -> None:
    from rich.console import Console

    status = _status(
        phase=Phase.NEEDS_OPERATOR,
        operator_reason="restart budget exhausted: 5 restarts in 3600s",
        suggested_actions=["lazarus resume tiny", "lazarus cancel tiny"],
    )
    console = Console(width=160, record=True, color_system=None)
    console.print(
        cli_render.render_status(cli_render.StatusView("lazarus-tiny", "RUNNING", status))
    )
    text = console.export_text()
    assert "NEEDS_OPERATOR" in text
    assert "restart budget exhausted" in text
    assert "lazarus resume tiny" in text
    assert "87.5%" in text  # ETTR
    assert "1/5" in text  # restarts
    assert "killed by SIGKILL" in text
    assert "rank 1 was killed" in text


def test_settings_from_env_and_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPORAL_ADDRESS", "temporal.example:7233")
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "research")
    monkeypatch.setenv("LAZARUS_TASK_QUEUE", "gpu-box")
    monkeypatch.setenv("TEMPORAL_TLS_CERT", "/certs/client.pem")
    monkeypatch.setenv("TEMPORAL_TLS_KEY", "/certs/client.key")
    monkeypatch.setenv("TEMPORAL_API_KEY", "super-secret-key")

    settings = ConnectionSettings.from_env(namespace=None, address="override:7233")

    assert settings.address == "override:7233"
    assert settings.namespace == "research"
    assert settings.task_queue == "gpu-box"
    assert settings.tls is True  # implied by the client certificate
    assert settings.tls_cert_path == Path("/certs/client.pem")
    assert settings.api_key is not None
    assert "super-secret-key" not in repr(settings)
    assert "super-secret-key" not in settings.model_dump_json()
    assert "api_key" not in settings.model_dump()
    with pytest.raises(TypeError):
        ConnectionSettings.from_env(api_key="nope")


def test_settings_read_the_temporal_cli_profile_under_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "temporal.toml"
    config.write_text(
        '[profile.default]\naddress = "file.example:7233"\nnamespace = "ml"\n'
        'api_key = "from-the-file"\n'
        '[profile.default.tls]\nclient_cert_path = "/certs/c.pem"\n'
        'client_key_path = "/certs/c.key"\n'
        '[profile.staging]\naddress = "staging:7233"\n'
        '[profile.inline.tls]\nclient_cert_data = "-----BEGIN CERTIFICATE-----"\n'
    )
    env = {"TEMPORAL_CONFIG_FILE": str(config)}
    settings = ConnectionSettings.from_env(env)
    assert (settings.address, settings.namespace) == ("file.example:7233", "ml")
    assert settings.tls and settings.tls_key_path == Path("/certs/c.key")
    assert settings.api_key is not None and "from-the-file" not in repr(settings)
    # The environment overrides the file, as for the temporal CLI; a profile is chosen by name.
    assert ConnectionSettings.from_env({**env, "TEMPORAL_NAMESPACE": "x"}).namespace == "x"
    staging = ConnectionSettings.from_env({**env, "TEMPORAL_PROFILE": "staging"})
    assert staging.address == "staging:7233" and not staging.tls
    with pytest.raises(ConnectionProblem, match="'nope' not found"):
        ConnectionSettings.from_env({**env, "TEMPORAL_PROFILE": "nope"})
    with pytest.raises(ConnectionProblem, match="set client_cert_path instead"):
        ConnectionSettings.from_env({**env, "TEMPORAL_PROFILE": "inline"})


def test_web_ui_url(monkeypatch: pytest.MonkeyPatch) -> None:
    local = ConnectionSettings(address="localhost:7233")
    assert web_ui_url(local, "lazarus-tiny") == (
        "http://localhost:8233/namespaces/default/workflows/lazarus-tiny"
    )
    assert web_ui_url(ConnectionSettings(address="127.0.0.1:17000")) == (
        "http://localhost:18000/namespaces/default/workflows"
    )
    assert web_ui_url(ConnectionSettings(address="temporal.internal:7233")) is None
    monkeypatch.setenv("LAZARUS_UI_URL", "https://ui.example/")
    assert web_ui_url(local, "x") == "https://ui.example/namespaces/default/workflows/x"


def test_dev_server_command_registers_search_attributes(tmp_path: Path) -> None:
    command = dev_server_command(17233, 18233, tmp_path)
    assert command[1:3] == ["server", "start-dev"]
    assert Path(command[0]).name == "temporal"
    joined = " ".join(command)
    assert f"--db-filename {tmp_path / 'temporal.sqlite'}" in joined
    assert "--ip 127.0.0.1 --port 17233 --ui-port 18233" in joined
    for flag in (
        "LazarusPhase=Keyword",
        "LazarusStep=Int",
        "LazarusJob=Keyword",
        "LazarusFailureClass=Keyword",
        "LazarusGeneration=Int",
    ):
        assert f"--search-attribute {flag}" in joined


def test_incident_reasons_survive_a_narrow_terminal() -> None:
    from rich.console import Console

    console = Console(width=80, record=True, color_system=None)
    console.print(cli_render.incidents_table(_status().incidents))
    text = console.export_text()
    assert "killed" in text and "0.40" in text and "7.50" in text
    assert "#1 restart: rank 1 was killed" in text


def test_dev_server_ui_sits_at_grpc_port_plus_1000(tmp_path: Path) -> None:
    """``web_ui_url`` guesses the UI from the address; DevServer keeps that guess right."""
    from lazarus.app.devserver import DevServer

    server = DevServer(tmp_path)  # constructing starts nothing
    assert server.ui_port == server.port + 1000
    assert web_ui_url(ConnectionSettings(address=server.address)) == (
        f"{server.ui_url}/namespaces/default/workflows"
    )


def test_classify_prints_class_and_evidence_as_json(tmp_path: Path) -> None:
    log = tmp_path / "rank.log"
    log.write_text(
        "Traceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of memory.\n"
    )
    result = CliRunner().invoke(cli.app, ["classify", str(log), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["class"] == "oom_gpu" and data["evidence"]


def test_classify_unreadable_file_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli.app, ["classify", str(tmp_path / "absent.log")])
    assert result.exit_code == 2


def test_status_shows_stragglers_and_escalation_hooks() -> None:
    from rich.console import Console

    from workflows.state import StragglerRecord

    straggler = StragglerRecord(
        generation=2,
        node="h3",
        rank=5,
        slowdown=2.04,
        compute_s=0.204,
        peers_compute_s=0.1,
        slow_since=1000.0,
        detected_at=1004.2,
        detection_s=4.2,
        action="record",
        reason="rank 5 on h3 is 2.04x slower than its peers; no spare to move to",
    )
    status = _status(stragglers=[straggler])
    status.incidents[0].escalation_hook = "ran"
    console = Console(width=200, record=True, color_system=None)
    console.print(
        cli_render.render_status(cli_render.StatusView("lazarus-tiny", "RUNNING", status))
    )
    text = console.export_text()
    assert "stragglers" in text and "2.04x" in text and "no spare to move to" in text
    assert "on_escalation: ran" in text
    body = cli_render.status_json(cli_render.StatusView("lazarus-tiny", "RUNNING", status))
    assert body["stragglers"][0]["node"] == "h3"


def test_version_prints_the_installed_version_and_needs_no_server() -> None:
    from lazarus.domain.version import __version__

    result = CliRunner().invoke(cli.app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"lazarus {__version__}"
