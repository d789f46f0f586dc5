# The two commands of the README: `make demo` and `make test`. Both set up what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
BACKEND ?= local

.PHONY: demo test lint format bench constraints clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing airflow-provider-gpu and its pinned dependencies into $(VENV) (log: $(VENV)/install.log) ..."
	@$(BIN)/python -m pip install --disable-pip-version-check --upgrade 'pip>=24' > $(VENV)/install.log 2>&1 \
	  && $(BIN)/python -m pip install --disable-pip-version-check -c constraints.txt -e '.[dev]' >> $(VENV)/install.log 2>&1 \
	  || { tail -40 $(VENV)/install.log; echo "install failed: see $(VENV)/install.log"; exit 1; }
	@$(BIN)/python -c "import gpu_provider, airflow, numpy, moto, pytest"
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
