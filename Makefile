# The two commands of the README: `make demo` and `make test`. Both create .venv and install
# everything they need on a fresh machine; `make chaos` and `make bench` are the long runs (make chaos:
# the `slow` tests of tests/chaos and tests/process: each the long twin of a short one in make test,
# or a process test's variant on the store make test does not run it on, tests/store_split.py).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# make test runs the suite on pytest-xdist workers, each with its own Redis, PostgreSQL template,
# lockdep folder and tmp dir (tests/conftest.py). Most of a process test's time is spent waiting
# for its worker fleet, so more workers than cores pay off; worksteal rebalances the long process
# tests that pile up at the end. PYTEST_XDIST= (empty) runs serially; -n0 in PYTEST_ARGS does too.
PYTEST_XDIST ?= -n 4 --dist worksteal
# Each test's seconds, written by every run (tests/budget_plugin.py) and checked against
# tests/budget.toml after pytest: `make test` fails naming each file that took over 2x its budget.
DURATIONS ?= .test-durations.json

.PHONY: venv demo test lint bytecode unit chaos scale bench mutants budget clean

# The pinned ExifTool (pyproject.toml [tool.photojobs.exiftool]) goes into $(VENV)/bin/exiftool.
$(STAMP): pyproject.toml .ci/install_exiftool.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,embedded]'
	$(PY) .ci/install_exiftool.py $(VENV)
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# The project's own modules compiled once (a worker, sweeper or CLI process imports ~200 of them):
# where PYTHONDONTWRITEBYTECODE is set (it is on our CI machines) no import ever writes a .pyc and
# every process compiled them all again (~0.3-0.5 s of CPU each, thousands of processes a run).
# compileall writes them whatever that says; a module edited later is compiled again as usual.
bytecode: $(STAMP)
	$(PY) -m compileall -q -j 0 actors middleware store photos photojobs tests benchmarks >/dev/null

test: $(STAMP) lint bytecode
	$(PY) -m pytest -q -m "not slow" --maxfail=10 --durations-json=$(DURATIONS) $(PYTEST_XDIST) $(PYTEST_ARGS) || { rc=$$?; [ $$rc -ne 5 ] || \
	  echo "make test: pytest collected no tests (exit 5); check PYTEST_ARGS" >&2; exit $$rc; }
	$(PY) -m tests.budget check $(DURATIONS)

# Rewrite tests/budget.toml from the last run's times (1.5x headroom; README "Testing the repository").
budget: $(STAMP)
	$(PY) -m tests.budget update $(DURATIONS)

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

chaos: $(STAMP)
	PHOTOJOBS_CHAOS_SECONDS=$${PHOTOJOBS_CHAOS_SECONDS:-300} $(PY) -m pytest -q -m slow --durations-json= tests/chaos tests/process $(PYTEST_ARGS)
	PHOTOJOBS_FUZZ_EXAMPLES=$${PHOTOJOBS_FUZZ_EXAMPLES:-300} $(PY) -m pytest -q --durations-json= tests/integration/test_api_fuzz.py $(PYTEST_ARGS)

# The 1M-item EXPLAIN check of every hot-path statement on both stores (minutes; not in make test).
scale: $(STAMP)
	$(PY) -m pytest -q -m slow tests/integration/test_query_plans.py $(PYTEST_ARGS)

# The mutation suite (tests/mutants/mutations.toml): every listed bug applied to a scratch copy of the
# tree must be killed by its tests (README "Proofs and mutations"; make test runs the fast ones).
mutants: $(STAMP)
	$(PY) -m tests.mutants.run $(MUTANTS_ARGS)

bench: $(STAMP)
	$(PY) -m benchmarks

demo: $(STAMP) bytecode
	$(PY) -m photojobs.demo

clean:
	rm -rf $(VENV) .photojobs demo-photos
