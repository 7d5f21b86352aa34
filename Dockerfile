# codemode host service image: `codemode serve --http` (FastAPI + MCP streamable HTTP, see docs/service.md).
#
# This is the HOST: it holds the capability packs, the authorizer, credentials and the Docker client.
# Programs never run in it: each execute runs in a fresh worker container (worker_image/Dockerfile)
# that this service starts through the Docker Engine API.
#
# Build, from the repository root:
#     docker build -t codemode-service:0.1 .
#     docker build --build-arg BASE_IMAGE=registry.example/python:3.11-slim -t codemode-service:0.1 .
#     offline, from the debootstrap base (no pip, no venv) with a wheel directory .build-wheels/:
#     scripts/provision-kubernetes.sh builds codemode-service:e2e this way.
#
# Build args:
#   BASE_IMAGE    any image with CPython >= 3.11 as `python3` on PATH (default python:3.11-slim); it
#                 needs pip unless .build-wheels/ holds a pip wheel
#   PIP_INDEX_URL optional package index mirror
#
# Run with the Docker runtime. The service reaches the engine through a configured socket:
#   * local socket: mount it and add the socket's group (the service runs as a non-root user):
#       docker run -d -p 8000:8000 \
#         -v /var/run/docker.sock:/var/run/docker.sock \
#         --group-add "$(stat -c %g /var/run/docker.sock)" \
#         -v "$PWD/deploy:/etc/codemode:ro" -e CODEMODE_CONFIG=/etc/codemode/codemode.toml \
#         codemode-service:0.1
#   * remote engine or a socket proxy (recommended: expose only the container/image endpoints the
#     runtime uses): set CODEMODE_DOCKER_BASE_URL=tcp://docker-proxy:2375 (or DOCKER_HOST).
# Whoever can reach the Docker socket controls the machine: give it to this service only, never to
# workers (they get no mounts at all).
#
# Data: the default data dir is /tmp/codemode (XDG_DATA_HOME=/tmp: the user has no home, and /tmp is
# the one writable place under k8s/'s read-only root filesystem); the store of suspended executes and
# state keys is a SQLite file there. Mount a volume there (or set CODEMODE_DATA_DIR) to keep it across
# restarts, or share it between replicas with CODEMODE_STORE=postgresql://... (docs/configuration.md).
#
# Configuration: CODEMODE_* environment variables and/or a TOML file named by CODEMODE_CONFIG
# (token hash file or JWKS, packs, authorizer, runtime, pool, limits, quota). The worker image named
# by docker_image must be present on the engine; /readyz fails until it is.
#
# Ports: 8000 (MCP at /mcp, /healthz, /readyz); /metrics only on metrics_port (9464, loopback unless metrics_host).

ARG BASE_IMAGE=python:3.11-slim

# ---------------------------------------------------------------------------------------- base
# regopy (the Rego authorizer) needs libatomic.so.1. The debootstrap base carries it
# (scripts/provision-docker.sh, BASE_PACKAGES); python:3.11-slim does not, so it is installed here
# (that build has the network; the offline build from the debootstrap base needs none).
FROM ${BASE_IMAGE} AS base
RUN if ! ldconfig -p | grep -q 'libatomic\.so\.1'; then \
        command -v apt-get >/dev/null || { echo "the base lacks libatomic.so.1 (regopy needs it) and apt-get: add libatomic1 to it (scripts/provision-docker.sh, BASE_PACKAGES)" >&2; exit 1; }; \
        apt-get update -qq && \
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libatomic1 && \
        rm -rf /var/lib/apt/lists/*; \
    fi

# ---------------------------------------------------------------------------------------- build
FROM base AS build
ARG PIP_INDEX_URL
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY host ./host
COPY capabilities ./capabilities
COPY worker_image/codemode_worker ./worker_image/codemode_worker
# The service runs no sandbox escape tests: the test-only worker entry stays out of this image too
# (codemode image audit's "test entries" check; worker_image/install_deps.py leaves it out of the
# production worker the same way).
RUN rm -f ./worker_image/codemode_worker/testing_entry.py
# Offline builds: a directory .build-wheels/ in the context holding a pip wheel and every dependency's
# wheel (scripts/provision-kubernetes.sh makes it) is used with --no-index; a base without pip or venv
# (the debootstrap base) needs it. Without it, the base's own pip installs from the index. The service
# carries both optional extras: the Kubernetes runtime and quota store, and tracing.
COPY README.md .build-wheel[s] /wheels/
RUN set -e; \
    if ls /wheels/pip-*.whl >/dev/null 2>&1; then \
        pip="$(ls /wheels/pip-*.whl | head -n 1)/pip"; set -- --no-index --find-links /wheels; \
    else pip="-m pip"; set --; fi; \
    python3 $pip install "$@" --no-compile --no-warn-script-location --prefix /opt/codemode "/src[kubernetes,tracing]"; \
    site="$(find /opt/codemode -type d \( -name site-packages -o -name dist-packages \) | head -n 1)"; \
    ln -s "$site" /opt/codemode/site; \
    [ -d /opt/codemode/bin ] || ln -s "$(dirname "$(find /opt/codemode -name codemode -type f | head -n 1)")" /opt/codemode/bin
RUN ["env", "PYTHONPATH=/opt/codemode/site", "python3", "-I", "-c", "import sys; sys.path.insert(0, '/opt/codemode/site'); import importlib.util, codemode.cli, codemode.service, codemode.mcp, codemode.runtimes.docker, codemode.runtimes.kubernetes.runtime, opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter; from codemode.authz.rego import RegoAuthorizer; RegoAuthorizer('data.p.allow', {'p.rego': 'package p\\nallow := true\\n'}).close(); assert importlib.util.find_spec('codemode_worker.testing_entry') is None; print('codemode service ok')"]

# ---------------------------------------------------------------------------------------- service
FROM base
LABEL io.codemode.role="service" \
      org.opencontainers.image.title="codemode-service" \
      org.opencontainers.image.description="codemode host: authenticated MCP over streamable HTTP; runs programs in single-use worker containers"

COPY --from=build /opt/codemode /opt/codemode
ENV PATH=/opt/codemode/bin:$PATH \
    PYTHONPATH=/opt/codemode/site \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    CODEMODE_HOST=0.0.0.0 \
    CODEMODE_PORT=8000 \
    CODEMODE_RUNTIME=docker \
    XDG_DATA_HOME=/tmp

# Numeric non-root user; it owns nothing in the image. Mount configuration read-only.
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000
# The health port (health_port, default 8001): tenants on the main port cannot saturate it.
HEALTHCHECK --interval=30s --timeout=3s --start-period=10s \
    CMD ["python3", "-I", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('CODEMODE_HEALTH_PORT', '8001'), timeout=2)"]
ENTRYPOINT ["codemode"]
CMD ["serve", "--http"]
