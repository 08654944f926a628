# Two entry points for a fresh machine: `make run` (the main job) and `make test` (the suite).
# Each builds the virtual environment first if it is missing or older than pyproject.toml.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.netcl-installed

.PHONY: run test install bench-cpu clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[pocl,test]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/netcl train

test: $(STAMP)
	$(VENV)/bin/ruff check .  # the rule set in pyproject.toml ([tool.ruff.lint])
	$(VENV)/bin/lint-imports  # the layers of docs/DESIGN.md, and no import cycles ([tool.importlinter])
	$(PY) scripts/oclgrind_check.py -q  # every kernel under Oclgrind: no out-of-bounds access, no race
	$(PY) scripts/test_matrix.py $(PYTEST_ARGS)  # the suite on each OpenCL CPU driver: PyPI's PoCL, Debian's, forced targets

clean:
	rm -rf $(VENV) build *.egg-info
