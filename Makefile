# Two commands do everything on a fresh machine:
#   make run   - create .venv, install pinned dependencies, serve the default endpoint
#   make test  - install the test dependencies too, run the whole suite
# Exact versions come from requirements/*.lock (regenerate with `make lock`).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
UV     := $(VENV)/bin/uv
UV_VERSION := 0.13.8
ENDPOINT ?= examples/whisper-tiny-en.yaml
# Extra arguments for `tideserve up`, e.g. make run UP_ARGS="--port 8081 --config local.yaml"
UP_ARGS ?=

.PHONY: run test test-unit test-k8s bench lock clean prometheus proto

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)

$(VENV)/.run-installed: $(PY) requirements/run.lock pyproject.toml
	$(UV) pip install -q --python $(PY) -r requirements/run.lock
	$(UV) pip install -q --python $(PY) --no-deps -e .
	touch $@

# torch (the gpu extra's big piece) comes from PyPI through plain pip, whose cache keeps the
# multi-GB wheel between runs on one machine; it stays out of the locks. Only the torch backend
# and its tests need it; `make run` does not install it.
TORCH_VERSION := 2.13.0

$(VENV)/.test-installed: $(VENV)/.run-installed requirements/test.lock
	$(UV) pip install -q --python $(PY) -r requirements/test.lock
	$(PY) -m pip install -q --disable-pip-version-check torch==$(TORCH_VERSION)
	touch $@

run: $(VENV)/.run-installed
	$(VENV)/bin/tideserve up $(ENDPOINT) --log-format text $(UP_ARGS)

test: $(VENV)/.test-installed prometheus
	$(VENV)/bin/ruff check src tests bench scripts
	$(VENV)/bin/lint-imports --config pyproject.toml
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest -q

# The pure unit tier: policies, spec, protocol, sources, gateway logic; no model, media stack,
# optional extra or subprocess (conftest fails the run if one is imported). Seconds, not minutes.
PURE_TESTS := tests/unit/core tests/unit/autoscaler tests/unit/provisioner tests/unit/spec tests/unit/protocol \
	tests/unit/metrics tests/unit/project tests/unit/sources/test_cache.py tests/unit/sources/test_main.py tests/unit/runtime tests/unit/engines \
	tests/unit/gateway tests/unit/http
test-unit: $(VENV)/.test-installed
	TIDESERVE_PURE=1 $(VENV)/bin/pytest -q -p no:cacheprovider -p no:audioeval $(PURE_TESTS) \
		--ignore=tests/unit/gateway/test_externalscaler_proto.py

# Kubernetes end to end (tests/k8s): etcd, kube-apiserver/-controller-manager/-scheduler, kwok,
# Karpenter's kwok provider, KEDA and helm built from the Go module proxy once per version into
# ~/.cache/tideserve-k8s (scripts/k8s/build.sh; needs Go), then run on loopback. A piece that does
# not build is named by the tests that need it.
test-k8s: $(VENV)/.test-installed
	scripts/k8s/build.sh || echo "scripts/k8s/build.sh: some pieces did not build (see above); tests/k8s names them"
	TIDESERVE_K8S=1 $(VENV)/bin/pytest -q -p no:cacheprovider tests/k8s

# The observability tests scrape a real Prometheus (Debian's package; started by the tests on
# loopback). Installing it needs root, as CI has; elsewhere install `prometheus` yourself.
prometheus:
	@if command -v prometheus >/dev/null && command -v promtool >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	else echo "make test needs Debian's prometheus package: sudo apt-get install prometheus"; exit 1; fi

bench: $(VENV)/.test-installed
	$(PY) bench/gateway_overhead.py

# Regenerate the KEDA external-scaler modules from src/tideserve/gateway/externalscaler.proto
# (commit the result; tests/unit/gateway/test_externalscaler_proto.py checks they are current).
proto: $(VENV)/.test-installed
	$(PY) scripts/gen_proto.py

# Re-pin every dependency (needs network to PyPI).
lock: $(PY)
	$(UV) pip compile -q pyproject.toml --python-version 3.11 -o requirements/run.lock
	$(UV) pip compile -q pyproject.toml --extra test --extra s3 --extra hf --extra k8s --extra sim --python-version 3.11 \
		-c requirements/run.lock -o requirements/test.lock

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info src/*.egg-info
