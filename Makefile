# Every target runs inside the virtual environment .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck contracts unit integration bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,demo]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/rightsizer demo

lint: $(STAMP)
	$(BIN)/ruff check functions tests benchmarks
	$(BIN)/ruff format --check functions tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

contracts: $(STAMP)
	$(BIN)/lint-imports

test: lint typecheck contracts
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/plan_scale.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
