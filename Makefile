# The two commands (see README):
#   make app    set up if needed, then serve the app on http://localhost:8501
#   make test   set up if needed, then lint and run the whole test suite
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: app test test-gpu bench test-robustness load-test
app:
	scripts/bootstrap.sh app
	$(PY) -m streamlit run app.py

# Two pytest-xdist workers (CI has 2 cores). --dist loadfile keeps each test file on one worker,
# so a file's module-scoped fixture (an app server and browser, a Triton-interpreter child that
# runs all of the file's kernel cases) starts once, not once per worker that got one of its
# tests. Each worker and its children run torch on one OpenMP thread (tests/conftest.py).
test:
	scripts/bootstrap.sh test
	$(PY) -m ruff check .
	$(PY) -m pytest -n 2 --dist loadfile

# Needs an NVIDIA GPU: only the tests marked gpu. Eight worker processes, because on a fresh
# machine (empty Triton cache) compiling the kernels dominates: about 4 s per test serially,
# the whole suite in 2.5 minutes on an H200 host's 16 cores this way. Peaks are per process
# (max_memory_allocated), so the workers do not disturb each other's measurements.
test-gpu:
	$(PY) -m pytest -m gpu -n 8

# Hostile input, faults, exposure and a load smoke (docs/ROBUSTNESS.md); also part of `make test`.
# RUN_LOAD=1 adds the 5-session x 15 s browser load run.
test-robustness:
	$(PY) -m pytest -m robustness

# The full load run whose figures docs/ROBUSTNESS.md reports (about 2 minutes).
load-test:
	$(PY) scripts/load_test.py --sessions 20 --seconds 60
