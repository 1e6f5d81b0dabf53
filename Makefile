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

.PHONY: run test lint bench lock clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)

$(VENV)/.run-installed: $(PY) requirements/run.lock pyproject.toml
	$(UV) pip install -q --python $(PY) -r requirements/run.lock
	$(UV) pip install -q --python $(PY) --no-deps -e .
	touch $@

$(VENV)/.test-installed: $(VENV)/.run-installed requirements/test.lock
	$(UV) pip install -q --python $(PY) -r requirements/test.lock
	touch $@

run: $(VENV)/.run-installed
	$(VENV)/bin/tideserve up $(ENDPOINT) --log-format text $(UP_ARGS)

test: $(VENV)/.test-installed
	$(VENV)/bin/lint-imports --config pyproject.toml
	$(VENV)/bin/pytest -q

bench: $(VENV)/.test-installed
	$(PY) bench/gateway_overhead.py

# Re-pin every dependency (needs network to PyPI).
lock: $(PY)
	$(UV) pip compile -q pyproject.toml --python-version 3.11 -o requirements/run.lock
	$(UV) pip compile -q pyproject.toml --extra test --python-version 3.11 -c requirements/run.lock -o requirements/test.lock

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info src/*.egg-info
