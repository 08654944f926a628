# Two entry points for a fresh machine: `make run` (the main job) and `make test` (the suite), and
# `make test-gpu` for a machine with a GPU's OpenCL driver. Each builds the virtual environment first if
# it is missing or older than pyproject.toml.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.netcl-installed

.PHONY: run test test-gpu install bench-cpu clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -e ".[pocl,test]"
	@# the bytecode on every core (pip compiles it on one: 30 of its 54 s on 2 cores); a file that does not
	@# compile (torch ships test files of newer Pythons) is left to Python, as pip leaves it
	$(PY) -m compileall -q -j 0 $(VENV)/lib >/dev/null 2>&1 || true
	@# a driver that builds programs: Debian's PoCL where the pocl extra's does not know this CPU (Zen 5)
	$(PY) scripts/cpu_driver.py
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/netcl train

# test_matrix.py: the suite on each OpenCL CPU driver (PyPI's PoCL, Debian's, forced targets) and every
# kernel under Oclgrind (scripts/oclgrind_check.py: no out-of-bounds access, no race), two at a time
test: $(STAMP)
	$(VENV)/bin/ruff check .  # the rule set in pyproject.toml ([tool.ruff.lint])
	$(VENV)/bin/lint-imports  # the layers of docs/DESIGN.md, and no import cycles ([tool.importlinter])
	$(PY) scripts/test_matrix.py $(PYTEST_ARGS)

test-gpu: $(STAMP)
	$(PY) scripts/test_gpu.py $(PYTEST_ARGS)  # the suite, the guide's pages included, on the default GPU (NETCL_DEVICE=gpu); fails in one line without one

clean:
	rm -rf $(VENV) build *.egg-info
