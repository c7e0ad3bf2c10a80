# The two commands of the README:  `make demo`  and  `make test`.
# Everything they need is installed by them, into .venv/ and .cache/ (not committed).

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
DEMO_STAMP := $(VENV)/.stamp-demo
DEV_STAMP  := $(VENV)/.stamp-dev

# The project itself, as a strict editable install (a link tree that type checkers
# and pytest see exactly as the wheel lays it out). Cheap; redone every time so new
# modules are always linked.
define link
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e . --config-settings editable_mode=strict
endef

.PHONY: demo test lint typecheck unit integration wheel-check venv install kafka-fetch browser clean

# The demo needs the stream extra and, for `rankwatch grafana build`, the grafana one
# (no torch, no dev tools): a quick first run. `. .venv/bin/activate` then puts
# `rankwatch` on the PATH (README, "First run").
demo: $(DEMO_STAMP)
	$(link)
	$(VENV)/bin/rankwatch demo

test: install kafka-fetch browser lint typecheck
	scripts/pytest-suite.sh $(PY)
	$(MAKE) --no-print-directory wheel-check

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: install
	cd build/__editable__.rankwatch-0.1.0-py3-none-any && ../../$(PY) -m mypy --config-file ../../pyproject.toml rankwatch

unit: install
	$(PY) -m pytest -p no:cacheprovider -m "not integration" tests

integration: install kafka-fetch
	$(PY) -m pytest -p no:cacheprovider -m integration tests

# The tests that read the package's files (contracts, migrations, boards, the CLI and its
# config) once more against the built wheel (not the link tree), so packaging cannot rot
# unnoticed; test_packaging checks the wheel holds every module. (The whole unit suite
# here took 3 of CI's 25 minutes and guarded little more.)
WHEEL_TREE := build/wheel-tree
wheel-check: install
	rm -rf build/wheel build/lib $(WHEEL_TREE)  # build/lib: modules of earlier builds
	$(PY) -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir build/wheel .
	$(PY) -m zipfile -e build/wheel/rankwatch-*.whl $(WHEEL_TREE)
	PYTHONPATH=$(WHEEL_TREE) RANKWATCH_EXPECT_WHEEL=$(WHEEL_TREE) \
		$(PY) -m pytest -p no:cacheprovider -q -m "not integration" \
		tests/unit/test_packaging.py tests/unit/test_layering.py tests/unit/schemas \
		tests/unit/grafana tests/unit/app

venv: $(DEV_STAMP)

# Third-party dependencies: reinstalled only when pyproject.toml or setup.py change.
# (The demo's also when its extras change here.)
$(DEMO_STAMP): pyproject.toml setup.py Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip 'setuptools>=77' wheel
	$(PY) -m pip install --quiet -e '.[stream,grafana]'
	touch $@

$(DEV_STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip 'setuptools>=77' wheel
	$(PY) -m pip install --quiet -e '.[stream,grafana,host,torch,dev]'
	touch $@

install: $(DEV_STAMP)
	$(link)

kafka-fetch:
	scripts/kafka.sh fetch

# Headless Chromium for the report's rendering test (Debian's package).
browser:
	scripts/ensure-chromium.sh

clean:
	rm -rf $(VENV) build dist *.egg-info .cache
