"""The worker's Prometheus metrics without a server: definitions, the status answers
turned into counters idempotently, the activities' sink, settings and serving."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from activities import observe as observe_module
from activities.observe import Observation, install_sink, observe
from lazarus.app.metrics import (
    UNRECORDED_DECISION,
    LazarusMetrics,
    MetricsProblem,
    MetricsSettings,
    incident_timeline,
    phase_label,
    prepare_metrics,
    serve,
)
from lazarus.domain.failure_classes import FailureClass
from lazarus.domain.ports import free_port
from lazarus.domain.recovery_timeline import RecoveryTimeline
from workflows.playbook import Action
from workflows.state import Incident, JobStatus, NodePool, Phase, QuarantinedNode

pytestmark = pytest.mark.timeout(30)

FAULT_AT = 1_000.0


def incident(
    id: int = 1,
    failure_class: FailureClass = FailureClass.UNKNOWN,
    *,
    fault_at: float = FAULT_AT,
    recovered: bool = False,
    steps_lost: int | None = None,
    action: Action = Action.RESTART,
) -> Incident:
    opened = Incident.opened(
        id=id,
        generation=1,
        kind="crash",
        failure_class=failure_class,
        fault_at=fault_at,
        detected_at=fault_at + 0.4,
        rank=1,
    )
    opened.action = action
    opened.steps_lost = steps_lost
    if recovered:
        opened.stopped_at = fault_at + 1.0
        opened.relaunched_at = fault_at + 1.5
        opened.first_step_at = fault_at + 3.0
        opened.recovery_s = 3.0
    return opened


def status(
    *incidents: Incident,
    job: str = "job-a",
    phase: Phase = Phase.RUNNING,
    step: int | None = 40,
    **extra: object,
) -> JobStatus:
    return JobStatus.model_validate(
        {
            "job_id": job,
            "phase": phase,
            "generation": 1 + len(incidents),
            "step": step,
            "world_size": 2,
            "ranks": [],
            "restarts": len(incidents),
            "max_restarts": 5,
            "incidents": list(incidents),
            "ettr": 0.9,
            "elapsed_s": 100.0,
            **extra,
        }
    )


def value(metrics: LazarusMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def incidents_total(metrics: LazarusMetrics, job: str = "job-a") -> float:
    """Every incident of ``job``, whatever its class and decision."""
    return sum(
        sample.value
        for family in metrics.registry.collect()
        if family.name == "lazarus_incidents"
        for sample in family.samples
        if sample.name == "lazarus_incidents_total" and sample.labels["lazarus_job"] == job
    )


@pytest.fixture
def metrics() -> LazarusMetrics:
    return LazarusMetrics()


# --- definitions -------------------------------------------------------------------------


EXPECTED = {
    "lazarus_jobs": ("gauge", {"phase"}),
    "lazarus_job_phase": ("gauge", {"lazarus_job", "phase"}),
    "lazarus_job_step": ("gauge", {"lazarus_job"}),
    "lazarus_job_generation": ("gauge", {"lazarus_job"}),
    "lazarus_job_ettr": ("gauge", {"lazarus_job"}),
    "lazarus_job_goodput_seconds": ("gauge", {"lazarus_job"}),
    "lazarus_job_elapsed_seconds": ("gauge", {"lazarus_job"}),
    "lazarus_job_mttr_seconds": ("gauge", {"lazarus_job"}),
    "lazarus_job_restarts_remaining": ("gauge", {"lazarus_job"}),
    "lazarus_job_nodes": ("gauge", {"lazarus_job", "state"}),
    "lazarus_quarantined_node": ("gauge", {"lazarus_job", "node", "fenced"}),
    "lazarus_job_durable_checkpoint_step": ("gauge", {"lazarus_job"}),
    "lazarus_incidents": ("counter", {"lazarus_job", "class", "decision"}),
    "lazarus_steps_lost": ("counter", {"lazarus_job", "class"}),
    "lazarus_detection_seconds": ("histogram", {"lazarus_job", "class"}),
    "lazarus_recovery_seconds": ("histogram", {"lazarus_job", "class"}),
    "lazarus_recovery_phase_seconds": ("summary", {"lazarus_job", "phase"}),
    "lazarus_supervision_poll_seconds": ("histogram", {"lazarus_job"}),
    "lazarus_checkpoint_save_seconds": ("gauge", {"lazarus_job"}),
    "lazarus_checkpoint_duration_seconds": ("summary", {"lazarus_job", "operation"}),
    "lazarus_checkpoint_bytes": ("counter", {"lazarus_job", "operation"}),
}


def test_every_metric_is_defined_with_its_type_and_labels(metrics: LazarusMetrics) -> None:
    metrics.record_status(
        status(
            incident(recovered=True, steps_lost=3),
            nodes=NodePool(
                active=["h1"], spares=[], quarantined=[QuarantinedNode(node="h2", reason="x", at=1)]
            ),
            durable_steps=[10, 20],
            mttr_s=3.0,
        )
    )
    for kind in ("supervision_poll", "checkpoint_save", "checkpoint_verify", "checkpoint_upload"):
        metrics.observe(Observation(kind=kind, job="job-a", seconds=0.5, size_bytes=100))  # type: ignore[arg-type]
    families = {f.name: f for f in text_string_to_metric_families(_exposition(metrics).decode())}
    for name, (kind, labels) in EXPECTED.items():
        assert name in families, f"{name} is not exposed"
        family = families[name]
        assert family.type == kind, name
        sample_labels = {k for s in family.samples for k in s.labels if k not in ("le",)}
        assert sample_labels == labels, name


PROMETHEUS_TARGET_LABELS = {"job", "instance"}
"""Labels Prometheus sets on every scraped series itself: a metric carrying one of its
own sees it renamed to ``exported_<label>`` under the default ``honor_labels: false``,
and dashboards keyed on it then see the scrape job instead (hence ``lazarus_job``)."""


def test_no_metric_carries_a_label_prometheus_sets_itself(metrics: LazarusMetrics) -> None:
    metrics.record_status(status(incident(recovered=True, steps_lost=1)))
    metrics.observe(Observation(kind="supervision_poll", job="job-a", seconds=0.1))
    for family in metrics.registry.collect():
        for sample in family.samples:
            clash = PROMETHEUS_TARGET_LABELS & set(sample.labels)
            assert not clash, f"{sample.name} carries {sorted(clash)}"


def _exposition(metrics: LazarusMetrics) -> bytes:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry)


# --- the status answers, idempotently -------------------------------------------------------


def test_the_same_answer_twice_counts_each_incident_once(metrics: LazarusMetrics) -> None:
    answer = status(incident(steps_lost=4))
    metrics.record_status(answer)
    metrics.record_status(answer)
    metrics.record_status(answer.model_copy(deep=True))
    assert (
        value(
            metrics,
            "lazarus_incidents_total",
            lazarus_job="job-a",
            **{"class": "unknown"},
            decision="restart",
        )
        == 1
    )
    assert (
        value(
            metrics, "lazarus_detection_seconds_count", lazarus_job="job-a", **{"class": "unknown"}
        )
        == 1
    )
    assert value(
        metrics, "lazarus_detection_seconds_sum", lazarus_job="job-a", **{"class": "unknown"}
    ) == pytest.approx(0.4)
    assert (
        value(metrics, "lazarus_steps_lost_total", lazarus_job="job-a", **{"class": "unknown"}) == 4
    )


def test_a_recovery_is_observed_once_when_it_closes(metrics: LazarusMetrics) -> None:
    metrics.record_status(status(incident()))
    assert (
        value(
            metrics, "lazarus_recovery_seconds_count", lazarus_job="job-a", **{"class": "unknown"}
        )
        is None
    )
    closed = status(incident(recovered=True, steps_lost=2))
    metrics.record_status(closed)
    metrics.record_status(closed)
    assert incidents_total(metrics) == 1
    assert (
        value(
            metrics, "lazarus_recovery_seconds_count", lazarus_job="job-a", **{"class": "unknown"}
        )
        == 1
    )
    assert (
        value(metrics, "lazarus_recovery_seconds_sum", lazarus_job="job-a", **{"class": "unknown"})
        == 3.0
    )
    # No timeline recorded: the controller's own phase times stand in for it.
    for phase, seconds in (
        ("detected", 0.4),
        ("survivors_stopped", 0.6),
        ("launch_requested", 0.5),
        ("first_new_step", 1.5),
    ):
        assert (
            value(metrics, "lazarus_recovery_phase_seconds_count", lazarus_job="job-a", phase=phase)
            == 1
        )
        got = value(metrics, "lazarus_recovery_phase_seconds_sum", lazarus_job="job-a", phase=phase)
        assert got == pytest.approx(seconds), phase


def test_a_recorded_timeline_gives_the_fine_phases() -> None:
    closed = incident(recovered=True)
    closed.timeline = RecoveryTimeline(
        fault_at=FAULT_AT,
        detected_at=FAULT_AT + 0.2,
        checkpoint_loaded_at=FAULT_AT + 2.0,
        first_step_at=FAULT_AT + 2.5,
    )
    phases = [phase_label(d.phase) for d in incident_timeline(closed).durations()]
    assert phases == ["detected", "checkpoint_loaded", "first_new_step"]


def test_new_incidents_add_and_old_ones_do_not(metrics: LazarusMetrics) -> None:
    first = incident(1, FailureClass.UNKNOWN, recovered=True)
    metrics.record_status(status(first))
    second = incident(2, FailureClass.HANG, fault_at=FAULT_AT + 50, action=Action.NEEDS_OPERATOR)
    metrics.record_status(status(first, second))
    metrics.record_status(status(first, second))
    assert incidents_total(metrics) == 2
    assert (
        value(
            metrics,
            "lazarus_incidents_total",
            lazarus_job="job-a",
            **{"class": "hang"},
            decision="needs_operator",
        )
        == 1
    )


def test_a_job_started_again_under_its_name_counts_its_incidents_again(
    metrics: LazarusMetrics,
) -> None:
    """Incident ids restart at 1 in a new start; the fault time tells them apart."""
    metrics.record_status(status(incident(1)))
    metrics.record_status(status(incident(1, fault_at=FAULT_AT + 3_600)))
    assert incidents_total(metrics) == 2


def test_incidents_dropped_before_first_sight_count_once_by_class(metrics: LazarusMetrics) -> None:
    answer = status(
        incident(61),
        incidents_dropped=60,
        dropped_by_class={"unknown": 50, "hang": 10},
    )
    metrics.record_status(answer)
    metrics.record_status(answer)
    # Later, the one seen in full is dropped too: it is not counted again.
    later = status(
        incident(62, fault_at=FAULT_AT + 9),
        incidents_dropped=61,
        dropped_by_class={"unknown": 51, "hang": 10},
    )
    metrics.record_status(later)
    assert (
        value(
            metrics,
            "lazarus_incidents_total",
            lazarus_job="job-a",
            **{"class": "hang"},
            decision=UNRECORDED_DECISION,
        )
        == 10
    )
    assert (
        value(
            metrics,
            "lazarus_incidents_total",
            lazarus_job="job-a",
            **{"class": "unknown"},
            decision=UNRECORDED_DECISION,
        )
        == 50
    )
    assert incidents_total(metrics) == 62


def test_an_undecided_incident_waits_for_its_decision(metrics: LazarusMetrics) -> None:
    undecided = incident()
    undecided.action = ""
    metrics.record_status(status(undecided))
    assert incidents_total(metrics) == 0
    metrics.record_status(status(incident()))
    assert incidents_total(metrics) == 1


def test_gauges_follow_the_newest_answer(metrics: LazarusMetrics) -> None:
    pool = NodePool(
        active=["h1", "h3"],
        spares=["h4"],
        quarantined=[QuarantinedNode(node="h2", reason="ecc", at=5.0, fenced=True)],
    )
    metrics.record_status(
        status(incident(), nodes=pool, durable_steps=[20, 40], mttr_s=2.5), step=44
    )
    assert value(metrics, "lazarus_job_step", lazarus_job="job-a") == 44
    assert value(metrics, "lazarus_job_ettr", lazarus_job="job-a") == 0.9
    assert value(metrics, "lazarus_job_goodput_seconds", lazarus_job="job-a") == pytest.approx(90.0)
    assert value(metrics, "lazarus_job_restarts_remaining", lazarus_job="job-a") == 4
    assert value(metrics, "lazarus_job_mttr_seconds", lazarus_job="job-a") == 2.5
    assert value(metrics, "lazarus_job_durable_checkpoint_step", lazarus_job="job-a") == 40
    assert value(metrics, "lazarus_job_nodes", lazarus_job="job-a", state="quarantined") == 1
    assert (
        value(metrics, "lazarus_quarantined_node", lazarus_job="job-a", node="h2", fenced="true")
        == 1
    )
    assert value(metrics, "lazarus_job_phase", lazarus_job="job-a", phase="RUNNING") == 1
    assert value(metrics, "lazarus_job_phase", lazarus_job="job-a", phase="RECOVERING") is None
    # The node goes back into service: its series goes; a new phase replaces the old.
    metrics.record_status(
        status(phase=Phase.PAUSED, nodes=NodePool(active=["h1", "h3"], spares=["h4", "h2"]))
    )
    assert value(metrics, "lazarus_job_phase", lazarus_job="job-a", phase="RUNNING") is None
    assert value(metrics, "lazarus_job_phase", lazarus_job="job-a", phase="PAUSED") == 1
    assert (
        value(metrics, "lazarus_quarantined_node", lazarus_job="job-a", node="h2", fenced="true")
        is None
    )
    assert value(metrics, "lazarus_job_nodes", lazarus_job="job-a", state="spare") == 2


def test_jobs_by_phase_count_every_tracked_job(metrics: LazarusMetrics) -> None:
    metrics.record_status(status(job="a"))
    metrics.record_status(status(job="b", phase=Phase.NEEDS_OPERATOR))
    metrics.record_status(status(job="c", phase=Phase.NEEDS_OPERATOR))
    assert value(metrics, "lazarus_jobs", phase="RUNNING") == 1
    assert value(metrics, "lazarus_jobs", phase="NEEDS_OPERATOR") == 2
    metrics.forget("b")
    assert value(metrics, "lazarus_jobs", phase="NEEDS_OPERATOR") == 1
    assert metrics.tracked_jobs() == ["a", "c"]


def test_forget_drops_every_series_of_the_job_and_only_those(metrics: LazarusMetrics) -> None:
    metrics.record_status(status(incident(recovered=True, steps_lost=1), job="gone"))
    metrics.observe(Observation(kind="supervision_poll", job="gone", seconds=0.01))
    metrics.record_status(status(incident(), job="kept"))
    metrics.forget("gone")
    text = _exposition(metrics).decode()
    assert 'lazarus_job="gone"' not in text
    assert 'lazarus_job="kept"' in text
    metrics.forget("gone")  # twice is fine


# --- the activities' sink ----------------------------------------------------------------------


@pytest.fixture
def sink(metrics: LazarusMetrics) -> Iterator[LazarusMetrics]:
    install_sink(metrics.observe)
    try:
        yield metrics
    finally:
        install_sink(None)


def test_activity_observations_reach_their_metrics(sink: LazarusMetrics) -> None:
    observe("supervision_poll", 0.003, job="j")
    observe("checkpoint_save", 1.5, job="j")
    observe("checkpoint_save", 1.25, job="j")
    observe("checkpoint_verify", 0.2, size_bytes=1_000, job="j")
    observe("checkpoint_upload", 2.0, size_bytes=5_000, job="j")
    observe("checkpoint_upload", 1.0, size_bytes=0, job="j")
    assert value(sink, "lazarus_supervision_poll_seconds_count", lazarus_job="j") == 1
    assert value(sink, "lazarus_checkpoint_save_seconds", lazarus_job="j") == 1.25
    assert (
        value(
            sink, "lazarus_checkpoint_duration_seconds_count", lazarus_job="j", operation="upload"
        )
        == 2
    )
    assert (
        value(sink, "lazarus_checkpoint_bytes_total", lazarus_job="j", operation="upload") == 5_000
    )
    assert (
        value(sink, "lazarus_checkpoint_bytes_total", lazarus_job="j", operation="verify") == 1_000
    )


def test_outside_an_activity_without_a_job_nothing_is_recorded(sink: LazarusMetrics) -> None:
    observe("supervision_poll", 0.003)
    assert "lazarus_supervision_poll_seconds_count{" not in _exposition(sink).decode()


def test_a_failing_sink_never_fails_the_activity() -> None:
    calls: list[Observation] = []

    def broken(observation: Observation) -> None:
        calls.append(observation)
        raise RuntimeError("registry on fire")

    install_sink(broken)
    try:
        observe("supervision_poll", 0.1, job="j")
        observe("supervision_poll", 0.1, job="j")
    finally:
        install_sink(None)
    assert len(calls) == 2


def test_without_a_sink_observe_does_nothing() -> None:
    install_sink(None)
    assert observe_module._sink is None
    observe("checkpoint_verify", 1.0, size_bytes=1, job="j")  # no error, no effect


# --- settings and serving ------------------------------------------------------------------------


def test_settings_default_the_sdk_port_to_the_next_one() -> None:
    settings = MetricsSettings.from_env({}, port=9464)
    assert (settings.port, settings.sdk_port, settings.sdk_enabled) == (9464, 9465, True)
    assert not MetricsSettings.from_env({}, port=9464, sdk_port=0).sdk_enabled
    assert MetricsSettings.from_env({}).port is None
    from_env = MetricsSettings.from_env(
        {"LAZARUS_METRICS_PORT": "9000", "LAZARUS_METRICS_INTERVAL_S": "2.5"}
    )
    assert (from_env.port, from_env.sdk_port, from_env.interval_s) == (9000, 9001, 2.5)
    assert MetricsSettings.from_env({"LAZARUS_METRICS_PORT": "9000"}, port=9100).port == 9100


@pytest.mark.slow  # serves HTTP
def test_the_endpoints_listen_on_loopback_unless_told_otherwise() -> None:
    """Audit 12.: unauthenticated, they named jobs, nodes and quarantines to every host
    that could reach the worker. Publishing them is an explicit setting."""
    assert MetricsSettings.from_env({}, port=9464).addr == "127.0.0.1"
    assert MetricsSettings().addr == "127.0.0.1"
    published = MetricsSettings.from_env({"LAZARUS_METRICS_ADDR": "0.0.0.0"}, port=9464)
    assert published.addr == "0.0.0.0"
    flag = MetricsSettings.from_env({"LAZARUS_METRICS_ADDR": "0.0.0.0"}, addr="::1")
    assert flag.addr == "::1"  # --metrics-addr wins over the environment
    server = serve(LazarusMetrics(), MetricsSettings.from_env({}, port=free_port()))
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()
        server.server_close()


def test_the_worker_passes_metrics_addr_through(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from lazarus.app import cli
    from workers import controller

    seen: list[MetricsSettings] = []

    async def run_worker(*args: object) -> None:
        assert isinstance(args[-1], MetricsSettings)
        seen.append(args[-1])

    monkeypatch.setattr(controller, "run_worker", run_worker)
    monkeypatch.delenv("LAZARUS_METRICS_ADDR", raising=False)
    argv = ["worker", "--metrics-port", "9464"]
    result = CliRunner().invoke(cli.app, [*argv, "--metrics-addr", "0.0.0.0"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(cli.app, argv)
    assert result.exit_code == 0, result.output
    assert [m.addr for m in seen] == ["0.0.0.0", "127.0.0.1"]


@pytest.mark.parametrize(
    ("env", "overrides", "named"),
    [
        ({"LAZARUS_METRICS_PORT": "http"}, {}, "LAZARUS_METRICS_PORT"),
        ({}, {"port": 70_000}, "--metrics-port"),
        ({"LAZARUS_METRICS_INTERVAL_S": "0"}, {}, "LAZARUS_METRICS_INTERVAL_S"),
        ({}, {"port": 9000, "sdk_port": 9000}, "--sdk-metrics-port"),
    ],
)
def test_bad_settings_are_one_line_naming_the_setting(
    env: dict[str, str], overrides: dict[str, object], named: str
) -> None:
    with pytest.raises(MetricsProblem) as refused:
        MetricsSettings.from_env(env, **overrides)
    message = str(refused.value)
    assert named in message and "\n" not in message


@pytest.mark.slow  # serves HTTP
def test_serve_exposes_the_registry_and_refuses_a_busy_port(metrics: LazarusMetrics) -> None:
    port = free_port()
    metrics.record_status(status(incident()))
    server = serve(metrics, MetricsSettings(port=port, addr="127.0.0.1"))
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            body = answer.read().decode()
        assert (
            'lazarus_incidents_total{class="unknown",decision="restart",lazarus_job="job-a"} 1.0'
            in body
        )
        with pytest.raises(MetricsProblem, match="--metrics-port"):
            serve(LazarusMetrics(), MetricsSettings(port=port, addr="127.0.0.1"))
    finally:
        server.shutdown()
        server.server_close()


def test_a_busy_port_is_refused_before_anything_binds() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(MetricsProblem, match=f"cannot listen on 127.0.0.1:{port}"):
            serve(LazarusMetrics(), MetricsSettings(port=port, addr="127.0.0.1"))


@pytest.mark.parametrize("busy", ["port", "sdk_port"])
def test_prepare_refuses_a_busy_port_before_the_worker_connects(busy: str) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        ports = {"port": free_port(), "sdk_port": free_port(), busy: taken}
        option = "--metrics-port" if busy == "port" else "--sdk-metrics-port"
        with pytest.raises(MetricsProblem, match=f"{option} {taken}: cannot listen"):
            prepare_metrics(MetricsSettings(addr="127.0.0.1", **ports))


def test_every_metric_comes_from_the_one_table_and_the_guide_names_each() -> None:
    """Metrics are defined once, as rows of ``LazarusMetrics``'s table (issue 40): a
    worker's registry holds exactly those (its process metrics aside), names are
    unique, and docs/guides/metrics.md names every one of them."""
    import re
    from pathlib import Path

    from lazarus.app.metrics import METRICS, LazarusMetrics

    names = [definition.name for definition in METRICS]
    assert len(names) == len(set(names))
    served = {family.name for family in LazarusMetrics().registry.collect()}
    # prometheus_client drops a counter's _total from its family name
    assert served == {name.removesuffix("_total") for name in names}
    guide = (Path(__file__).resolve().parents[2] / "docs/guides/metrics.md").read_text()
    assert set(names) <= set(re.findall(r"\blazarus_[a-z_]+", guide))
