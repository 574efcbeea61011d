# npud developer entry points. `make run` and `make test` are the README's two commands.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SOCKET ?= /run/npud/npud.sock

.PHONY: install run test lint typecheck unit bench clean

$(STAMP): pyproject.toml protocol/pyproject.toml client/pyproject.toml protocol/src/npu_protocol/_version.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ./protocol -e './client[trio]' -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/npud --backend auto --socket $(SOCKET)

lint: $(STAMP)
	$(BIN)/python -m ruff check .
	$(BIN)/python -m ruff format --check .

typecheck: $(STAMP)
	$(BIN)/python -m mypy

unit: $(STAMP)
	$(BIN)/python -m pytest -q

test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
