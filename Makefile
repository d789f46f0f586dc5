# The two commands of the README: `make demo` and `make test`. Both set up what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
BACKEND ?= local
# one pinned, tested set of dependencies per Python version (constraints/py3.X.txt)
PYVER  := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
CONSTRAINTS := constraints/py$(PYVER).txt

.PHONY: setup demo test test-lowest lint docs format bench constraints constraints-lowest clean

$(STAMP): pyproject.toml $(wildcard constraints/*.txt)
	@test -f $(CONSTRAINTS) || { echo "No pinned dependency set for Python '$(PYVER)' ($(PYTHON)). Supported: $(patsubst constraints/py%.txt,%,$(wildcard constraints/py*.txt)). Use e.g. 'make demo PYTHON=python3.11'."; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing airflow-provider-gpu and its pinned dependencies into $(VENV) (log: $(VENV)/install.log) ..."
	@$(BIN)/python -m pip install --disable-pip-version-check --upgrade 'pip>=24' > $(VENV)/install.log 2>&1 \
	  && $(BIN)/python -m pip install --disable-pip-version-check -c $(CONSTRAINTS) -e '.[dev]' >> $(VENV)/install.log 2>&1 \
	  || { tail -40 $(VENV)/install.log; echo "install failed: see $(VENV)/install.log"; exit 1; }
	@$(BIN)/python -c "import gpu_provider, airflow, numpy, moto, pytest, sphinx, myst_parser"
	@touch $(STAMP)

## Only the set-up the other targets do first: .venv with the pinned dependencies.
setup: $(STAMP)

## Run the example ML pipeline end to end and print what happened (BACKEND=local|batch|sagemaker|kubernetes|aws;
## BACKEND=kubernetes CLUSTER=1 with KUBECONFIG set: against that cluster instead of the emulator).
demo: $(STAMP)
	@$(BIN)/python scripts/demo.py --backend $(BACKEND) $(if $(CLUSTER),--cluster)

## Run the whole test suite, in parallel: most tests wait on processes and polls, not on the CPU, so
## more workers than cores pays (measured on 2 cores: see docs/development.md). TEST_WORKERS=0: serial.
## Python's bytecode cache stays on (also where PYTHONDONTWRITEBYTECODE is set): without it every worker and
## every Airflow or job process the tests start compiles the provider anew, and every worker rewrites each
## test module's asserts again (about 3 s per worker, 1 s per provider process: docs/development.md).
TEST_WORKERS ?= 6
test: $(STAMP)
	@env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup --durations=15 tests

## The lowest supported set (constraints/lowest/py3.X.txt: the lower bounds of pyproject.toml, resolved):
## install the built wheel against it in a fresh .venv-lowest, base install then [all], and smoke-test it
## (a one-task local DAG with `airflow dags test`). Downloads from the package index, so it is a CI step
## of its own (.ci/run), not a test: no test may reach the network.
test-lowest:
	@$(PYTHON) scripts/lowest_deps.py check

## ruff (lint + format check) and mypy (strict on gpu_provider/).
lint: $(STAMP)
	@$(BIN)/ruff check .
	@$(BIN)/ruff format --check .
	@$(BIN)/mypy

## The documentation site (docs/, Sphinx + MyST): warnings are errors, every cross-reference, internal link
## and anchor must resolve, external links must be well-formed (checked offline, nothing fetched).
## -E: a fresh environment each time, since the generated reference reads the code, which Sphinx does not track.
## Output: docs/_build/html.
docs: $(STAMP)
	@$(BIN)/python -m sphinx -E -W --keep-going -n -q -b html docs docs/_build/html
	@echo "docs built: docs/_build/html/index.html"

format: $(STAMP)
	@$(BIN)/ruff format .
	@$(BIN)/ruff check --fix .

## Benchmarks side by side with the anchor operators (benchmarks/README.md): every figure's script, --quick;
## FULL=1: the full runs (each under 10 minutes on 2 cores). They print their tables and write nothing
## (capacity_trace writes the traces it replays to a temporary folder and prints where).
BENCH_SCRIPTS := parse_cost polling latency recovery launch launch_floor capacity_trace
bench: $(STAMP)
	@for script in $(BENCH_SCRIPTS); do \
	  echo "== benchmarks/$$script.py $(if $(FULL),,--quick)"; \
	  $(BIN)/python benchmarks/$$script.py $(if $(FULL),,--quick) || exit 1; \
	done

## Re-pin this Python version's constraints file from the current virtualenv.
constraints: $(STAMP)
	@(echo "# Pinned, tested set for 'make' targets on Python $(PYVER). Regenerate: make constraints"; \
	  $(BIN)/python -m pip freeze --exclude-editable | grep -vi '^airflow-provider-gpu') > $(CONSTRAINTS)

## Re-resolve the lowest supported set for this Python version (after changing a lower bound).
constraints-lowest:
	@$(PYTHON) scripts/lowest_deps.py pin

clean:
	rm -rf $(VENV) .venv-lowest .demo build *.egg-info docs/_build
