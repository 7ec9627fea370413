# syntax=docker/dockerfile:1
# The kvpilot operator image: kopf running kvpilot.operator.main. No vLLM inside (the vllm extra is for the
# contract tests; the operator only renders vLLM's flags). Built and run by the Helm chart (charts/kvpilot).
#
#   docker build -t ghcr.io/kvpilot/kvpilot:0.1.0 .
#
# tests/test_dockerfile.py lints this file with hadolint and runs the same pip/venv/kopf commands in a clean
# virtual environment (no Docker engine is needed for that).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: the locked dependencies' wheels and the kvpilot wheel, then a self-contained virtualenv -------
# The dependencies come from requirements/operator.txt (pinned, hashed: `make lock`), kvpilot without its deps.
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements/operator.txt ./requirements/
COPY kvpilot ./kvpilot
RUN python -m pip wheel --require-hashes --only-binary=:all: --wheel-dir /wheels -r requirements/operator.txt \
 && python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv --without-pip /opt/kvpilot \
 && python -m pip --python /opt/kvpilot/bin/python install --no-index --find-links /wheels \
      --require-hashes --only-binary=:all: -r requirements/operator.txt \
 && python -m pip --python /opt/kvpilot/bin/python install --no-index --find-links /wheels --no-deps kvpilot \
 && python -m pip --python /opt/kvpilot/bin/python check

# ---- runtime: slim Python, the virtualenv, a non-root user; no compilers, pip, setuptools or wheels ------
FROM ${PYTHON_IMAGE} AS runtime
# pip, setuptools and wheel come with the base image; the operator needs none of them at run time.
RUN python -m pip uninstall --yes --quiet pip setuptools wheel \
 && groupadd --system --gid 10001 kvpilot \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin kvpilot
COPY --from=build /opt/kvpilot /opt/kvpilot
ENV PATH=/opt/kvpilot/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONSAFEPATH=1
# Numeric, so Kubernetes can verify runAsNonRoot; matches the chart's podSecurityContext.runAsUser.
USER 10001:10001
WORKDIR /tmp
# 8080: kopf's liveness endpoint (/healthz); 9102: the operator's own /metrics.
EXPOSE 8080 9102
ENTRYPOINT ["kopf"]
# Standalone defaults for `docker run`; the chart replaces them (peering, watched namespaces, priority).
CMD ["run", "--module=kvpilot.operator.main", "--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz"]
