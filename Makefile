# Two entry points for a fresh machine (see README): `make demo` and `make test`.
# Both create or reuse the project-local virtual environment in .venv and install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.shoal-installed
# Test-only: Hugging Face, Lightning and Accelerate, whose unchanged scripts tests/clients/ runs under
# shoal; installed beside the venv (--no-deps --target: torch untouched, never a shoal dependency).
CLIENTS := $(VENV)/clients
CLIENTS_REQ := tests/clients/requirements.txt

.PHONY: demo test test-quick test-gpu install clients clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

## Skipped when the stamp holds the same list (compared by content, not by file dates).
clients: $(STAMP)
	@cmp -s $(CLIENTS_REQ) $(CLIENTS)/.installed || { \
	  rm -rf $(CLIENTS) && \
	  $(BIN)/pip install --quiet --no-deps --target $(CLIENTS) -r $(CLIENTS_REQ) && \
	  cp $(CLIENTS_REQ) $(CLIENTS)/.installed; }

## The main job: train the bundled digits workload with 2 local worker processes on CPU.
demo: $(STAMP)
	$(BIN)/shoal train digits --nproc 2 --device cpu

## The whole test suite (CPU, real multi-process runs over gloo), three test files at a time on the
## 2 cores (pytest-xdist: a file's tests, and every test of the Slurm cluster or of the MLflow server,
## share one worker; two files at a time left the cores idle 10% of the run, three 1%: docs/contributing/TEST_TIME.md).
## The files are handed out longest first, as tests/conftest.py orders them (--no-loadscope-reorder: not
## xdist's fewest-tests-last, which left one worker alone with a multi-node file at the end).
## PYTEST_ARGS='-p no:xdist' runs one at a time.
## pytest runs between two readings of the speed gauge (`import torch`'s CPU-s, scripts/speed-gauge), which
## then prints make's own time beside the budget at that speed (CONTRIBUTING.md); the exit status is pytest's.
PYTEST_ARGS ?= -n 3 --dist loadgroup --no-loadscope-reorder
MAKE_START := $(shell date +%s)
GAUGE = $(BIN)/python scripts/speed-gauge --since $(MAKE_START)
test: $(STAMP) clients
	bash scripts/install-system-deps.sh
	$(BIN)/ruff check src benchmarks tests examples scripts/bench-slow-link scripts/gpu scripts/speed-gauge
	$(BIN)/ruff format --check src benchmarks tests examples scripts/bench-slow-link scripts/gpu scripts/speed-gauge
	$(GAUGE) --budget-min 25 -- $(BIN)/python -m pytest $(PYTEST_ARGS)

## On a lent GPU machine (docs/GPU.md): every gpu-marked test and a short CUDA benchmark set, one report
## (JSON and markdown) in GPU_OUT, within 8 minutes. No registry needed: the machine's own python3 (this
## venv's where there is one), shoal from src/. GPU_CHECK_ARGS=--dry-run lists what would run and checks it can.
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
GPU_OUT ?= runs/gpu-check
test-gpu:
	$(GPU_PYTHON) scripts/gpu/check.py --out $(GPU_OUT) $(GPU_CHECK_ARGS)

## A quick subset for iterating (no multi-process or slow test): see CONTRIBUTING.md.
test-quick: $(STAMP)
	$(GAUGE) --budget-min 3 --label "make test-quick" -- $(BIN)/python -m pytest -n 2 -m "not multiprocess and not slow"

clean:
	rm -rf $(VENV) runs .pytest_cache
