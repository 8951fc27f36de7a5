# syntax=docker/dockerfile:1
# The Lazarus controller worker: `lazarus worker`, as a non-root user, configured only by
# its environment (TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_TLS_CERT/KEY/CA paths,
# TEMPORAL_API_KEY, LAZARUS_ALLOWED_COMMANDS[_FILE], ...). No secret is baked in: TLS
# material and keys are mounted at run time (deploy/compose, deploy/helm).
#
#   docker build -t lazarus-worker:0.1.0 .
#
# The build stage's RUN steps are also executed, against a temporary venv, by
# tests/integration/test_deploy_files.py: they may use only $VIRTUAL_ENV and paths
# relative to WORKDIR, so the test runs exactly what the image build runs.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV VIRTUAL_ENV=/opt/lazarus \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY deploy/docker/worker-constraints.txt deploy/docker/worker-constraints.txt
COPY lazarus lazarus
COPY workflows workflows
COPY activities activities
COPY workers workers
RUN python -m venv "$VIRTUAL_ENV"
# Exact versions (the tested runtime closure); no extras: the controller never imports
# torch, ranks run the training image's own Python, and the worker talks to a real
# Temporal (no dev-server extra). The rank helper, lazarus.rank, is in lazarus-train.
RUN "$VIRTUAL_ENV/bin/pip" install --constraint deploy/docker/worker-constraints.txt .
RUN "$VIRTUAL_ENV/bin/lazarus" --help >/dev/null && \
    "$VIRTUAL_ENV/bin/python" -c "import workers.controller"

FROM ${PYTHON_IMAGE}
# A fixed uid/gid so Kubernetes' runAsUser, file ownership on mounted volumes and the
# systemd unit all agree; no login shell, no sudo, no password.
RUN groupadd --system --gid 10001 lazarus && \
    useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/lazarus \
        --create-home --shell /usr/sbin/nologin lazarus
COPY --from=build /opt/lazarus /opt/lazarus
ENV PATH=/opt/lazarus/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/var/lib/lazarus
WORKDIR /var/lib/lazarus
USER 10001:10001
# Prometheus endpoints with --metrics-port 9464: Lazarus's own, and the Temporal SDK's
# on the next port (--sdk-metrics-port). They bind to loopback unless
# LAZARUS_METRICS_ADDR (or --metrics-addr) says otherwise: 0.0.0.0 to be scraped from
# outside the container.
EXPOSE 9464 9465
# SIGTERM drains: running activities are cancelled and retried on another worker,
# ranks keep running (see docs/guides/upgrading.md).
STOPSIGNAL SIGTERM
ENTRYPOINT ["lazarus"]
CMD ["worker"]
