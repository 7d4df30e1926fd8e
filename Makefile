# The two commands (see README):
#   make app    set up if needed, then serve the app on http://localhost:8501
#   make test   set up if needed, then lint and run the whole test suite
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: app test test-gpu bench
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
