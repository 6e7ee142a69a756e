# Two entry points for a fresh machine (see README): `make demo` and `make test`.
# Both create or reuse the project-local virtual environment in .venv and install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.shoal-installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

## The main job: train the bundled digits workload with 2 local worker processes on CPU.
demo: $(STAMP)
	$(BIN)/shoal train digits --nproc 2 --device cpu

## The whole test suite (CPU, real multi-process runs over gloo). One file at a time by default;
## PYTEST_ARGS='-n 2 --dist loadgroup' runs two at a time (pytest-xdist; see README, "Tests").
PYTEST_ARGS ?=
test: $(STAMP)
	bash scripts/install-system-deps.sh
	$(BIN)/ruff check src tests examples scripts/bench-slow-link
	$(BIN)/ruff format --check src tests examples scripts/bench-slow-link
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
