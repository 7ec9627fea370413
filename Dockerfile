# syntax=docker/dockerfile:1
# The kvpilot operator image: kopf running kvpilot.operator.main. No vLLM inside (the vllm extra is for the
# contract tests; the operator only renders vLLM's flags). Built and run by the Helm chart (charts/kvpilot).
#
#   docker build -t ghcr.io/kvpilot/kvpilot:0.1.0 .                         # a machine with a registry
#   python -m e2e.image build                                               # no registry, no Docker engine
#
# The second line builds the same file with buildah (vfs storage, chroot isolation) from a base made locally by
# debootstrap (Debian bookworm's python3, python3-venv, python3-pip; see e2e/image.py), passed as PYTHON_IMAGE.
# Both stages use the same base, so the virtualenv's interpreter link resolves in the runtime stage.
# tests/test_dockerfile.py lints this file with hadolint and runs the build stage's pip/venv commands in a clean
# virtual environment; e2e/test_image.py builds the image for real and runs the operator from it.

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

# ---- runtime: the same base, the virtualenv, a non-root user; no compiler, no package manager -------------
# Neither base has a compiler. The base's package managers are deleted from the final filesystem: pip,
# setuptools, wheel and ensurepip (in every site directory, python:slim's /usr/local or Debian's /usr), and
# apt and dpkg's programs. dpkg's database (/var/lib/dpkg) stays, so image scanners can still list the packages.
FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 kvpilot \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin kvpilot \
 && for site in $(python -c 'import site; print(" ".join(site.getsitepackages()))'); do \
      rm -rf "$site"/pip "$site"/pip-* "$site"/setuptools "$site"/setuptools-* "$site"/pkg_resources \
             "$site"/_distutils_hack "$site"/distutils-precedence.pth "$site"/wheel "$site"/wheel-*; \
    done \
 && rm -rf /usr/local/bin/pip* /usr/bin/pip* /usr/lib/python3*/ensurepip /usr/local/lib/python3*/ensurepip \
           /usr/share/python-wheels \
 && rm -rf /usr/bin/apt* /usr/bin/dpkg* /usr/sbin/dpkg* /usr/lib/apt /usr/lib/dpkg /usr/share/dpkg /etc/apt \
           /var/lib/apt /var/cache/apt /var/cache/debconf /var/log/apt
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
