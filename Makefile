# Ringmaster: `make run` starts the portal, `make test` runs the tests. Both install what they need.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# On a machine whose nvidia-smi reports GPUs: a second environment, with PyTorch's CUDA build,
# beside .venv (not in var/, which the sandbox of local jobs hides from them).
CUDA_VENV ?= .venv-cuda
HOST   ?= 127.0.0.1
PORT   ?= 8000

# The tests use their own database and Redis database, whatever DATABASE_URL/REDIS_URL say.
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/ringmaster
TEST_REDIS_URL    ?= redis://127.0.0.1:6379/15

.PHONY: install run test test-services clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first, alone: `pip install torch==2.13.0` takes the local CPU build, never the CUDA one.
$(STAMP): requirements.txt pyproject.toml deploy/install-horovod.sh | $(PY)
	@echo "Installing Ringmaster's Python packages into $(VENV) (PyTorch's CPU build first; a few minutes, once)"
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .  # the ringmaster command
	deploy/install-horovod.sh $(PY)
	touch $@

install: $(STAMP)

run: install
	deploy/ensure-sandbox.sh
	$(PY) manage.py migrate --noinput
	$(PY) manage.py seed_demo
	$(PY) manage.py gpu_environment --env $(CUDA_VENV)   # nothing without GPUs; never fails the CPU portal
	@echo
	@echo "Ringmaster is starting at http://$(HOST):$(PORT)/ (a banner says when it is ready; Ctrl-C stops it)"
	@echo
	@rm -f "$${RINGMASTER_DATA_DIR:-var}"/run/*.ready   # ready_banner waits for this run's worker and beat
	RINGMASTER_HOST=$(HOST) RINGMASTER_PORT=$(PORT) $(VENV)/bin/honcho -f deploy/Procfile -d . start

test-services:
	tests/services.sh

# In parallel (pytest-xdist): each worker has a test database and a Redis database of its own
# (tests/parallel.py) and takes the next test as it finishes one, the longest first
# (tests/conftest.py); the slowest tests are listed at the end.
TEST_WORKERS ?= 4
test: install test-services
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(PY) -m pytest -n $(TEST_WORKERS) --maxschedchunk 1 --durations=15 $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(CUDA_VENV) var

# Benchmarks (bench/, figures in BENCHMARKS.md). Never part of `make test`. They empty the job
# tables of their own database and Redis database, so these never name the portal's or the tests'.
BENCH_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/ringmaster_bench
BENCH_REDIS_URL    ?= redis://127.0.0.1:6379/12
BENCHMARKS         ?= ingest latency fanout training kube_submit

.PHONY: bench
bench: install test-services
	@for name in $(BENCHMARKS); do \
		echo; BENCH_DATABASE_URL=$(BENCH_DATABASE_URL) BENCH_REDIS_URL=$(BENCH_REDIS_URL) \
		$(PY) bench/$$name.py $(BENCH_ARGS) || exit 1; \
	done
