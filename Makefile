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

# Needs an NVIDIA GPU: only the tests marked gpu, in several worker processes, because on a
# fresh machine (empty Triton cache) compiling the kernels dominates: about 4 s per test
# serially, the whole suite in 2.5 minutes in 8 workers on an H200 host's 16 cores. Peaks are
# per process (max_memory_allocated), so the workers do not disturb each other's measurements,
# but they share the GPU's memory: each worker's caching allocator keeps what its largest test
# so far reserved (on an 80 GB H100, 14 workers failed 8 tests that pass in 8). So the count
# (GPU_WORKERS) is sized from the free memory of the GPU the tests use (nvidia-smi, the first
# of CUDA_VISIBLE_DEVICES, else GPU 0) and the CPUs:
#   workers = min((free - GPU_LARGEST_MIB) / GPU_WORKER_MIB + 1, CPUs / 2), at least 1.
# GPU_WORKER_MIB, 10 GiB, is what a worker holds after the large tests most workers meet: the
# fp32 eager references at s = 8,192 of test_ring_attention's simulated ranks and
# test_sliding_window's 8,192-key case (B = 1, H = 8: one score matrix 8 x 8,192^2 x 4 B =
# 2 GiB, about 3.6 of them alive at the reference backward's peak, measured on the CPU at
# s = 2,048 and scaled: 7.3 GiB), plus the CUDA context, Triton's loaded kernels and the
# allocator's rounding (about 1 GiB), rounded up. GPU_LARGEST_MIB, 20 GiB, is the one test
# above that, test_train_harness's Llama-3.1-8B 4-layer training step (19.3 GB peak by calc's
# prediction), held once beside the others. CPUs / 2: the measured 8 workers on 16 cores
# (each worker's compiles also run ptxas). An 80 GB H100 gets 6, a 141 GB H200 with 16 cores
# 8. Without nvidia-smi: GPU_WORKERS_NO_GPU. `make test-gpu GPU_WORKERS=N` sets the count.
GPU_WORKER_MIB ?= 10240
GPU_LARGEST_MIB ?= 20480
GPU_WORKERS_NO_GPU ?= 2
GPU_WORKERS ?= $$(dev=$${CUDA_VISIBLE_DEVICES%%,*}; \
	free=$$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits \
		-i "$${dev:-0}" 2>/dev/null | head -n 1 | tr -d ' '); \
	cpus=$$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN); \
	case "$$free" in ''|*[!0-9]*) echo $(GPU_WORKERS_NO_GPU); exit;; esac; \
	n=$$(( (free - $(GPU_LARGEST_MIB)) / $(GPU_WORKER_MIB) + 1 )); \
	[ $$n -gt $$(( cpus / 2 )) ] && n=$$(( cpus / 2 )); \
	[ $$n -lt 1 ] && n=1; echo $$n)

test-gpu:
	@n=$(GPU_WORKERS); echo "make test-gpu: $$n worker(s)"; \
	$(PY) -m pytest -m gpu -n $$n

# Hostile input, faults, exposure and a load smoke (docs/ROBUSTNESS.md); also part of `make test`.
# RUN_LOAD=1 adds the 5-session x 15 s browser load run.
test-robustness:
	$(PY) -m pytest -m robustness

# The full load run whose figures docs/ROBUSTNESS.md reports (about 2 minutes).
load-test:
	$(PY) scripts/load_test.py --sessions 20 --seconds 60
