# The two commands (see README):
#   make app    set up if needed, then serve the app on http://localhost:8501
#   make test   set up if needed, then lint and run the whole test suite
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: app test test-gpu bench test-robustness load-test
app:
	scripts/bootstrap.sh app
	$(PY) -m streamlit run app.py

test:
	scripts/bootstrap.sh test
	$(PY) -m ruff check .
	$(PY) -m pytest

# Needs an NVIDIA GPU: only the tests marked gpu.
test-gpu:
	$(PY) -m pytest -m gpu

# Hostile input, faults, exposure and a load smoke (docs/ROBUSTNESS.md); also part of `make test`.
# RUN_LOAD=1 adds the 5-session x 15 s browser load run.
test-robustness:
	$(PY) -m pytest -m robustness

# The full load run whose figures docs/ROBUSTNESS.md reports (about 2 minutes).
load-test:
	$(PY) scripts/load_test.py --sessions 20 --seconds 60
