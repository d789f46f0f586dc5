# The two commands of the README: `make demo` and `make test`. Both set up what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
BACKEND ?= local

.PHONY: demo test lint format bench constraints clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing airflow-provider-gpu and its pinned dependencies into $(VENV) ..."
	@# (grep drops this machine's notes about unused local package mirrors; the import check below
	@#  is what fails the step if the install did not work)
	@$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade 'pip>=24' 2>&1 | grep -v '^WARNING: Location' || true
	@$(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]' 2>&1 | grep -v '^WARNING: Location' || true
	@$(BIN)/python -c "import gpu_provider, airflow, numpy, moto, pytest" || { echo "install failed: see the pip output above"; exit 1; }
	@touch $(STAMP)

## Run the example ML pipeline end to end on the local backend and print what happened.
demo: $(STAMP)
	@$(BIN)/python scripts/demo.py --backend $(BACKEND)

## Run the whole test suite.
test: $(STAMP)
	@$(BIN)/python -m pytest -q -p no:cacheprovider tests

## ruff (lint + format check) and mypy (strict on gpu_provider/).
lint: $(STAMP)
	@$(BIN)/ruff check .
	@$(BIN)/ruff format --check .
	@$(BIN)/mypy

format: $(STAMP)
	@$(BIN)/ruff format .
	@$(BIN)/ruff check --fix .

## DAG-parse import cost benchmark (writes nothing; copy its table into benchmarks/README.md).
bench: $(STAMP)
	@$(BIN)/python benchmarks/import_cost.py

## Re-pin constraints.txt from the current virtualenv.
constraints: $(STAMP)
	@(echo "# Pinned, tested set for 'make' targets (Python 3.11). Regenerate: make constraints"; \
	  $(BIN)/python -m pip freeze --exclude-editable | grep -vi '^airflow-provider-gpu') > constraints.txt

clean:
	rm -rf $(VENV) .demo build *.egg-info
