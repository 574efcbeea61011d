# npud developer entry points. `make run` and `make test` are the README's two commands.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Empty: /run/npud/npud.sock as root, a socket of your own otherwise (scripts/run-dev.sh).
SOCKET ?=
# More npud options for `make run`, e.g. ARGS='--config my.toml'.
ARGS   ?=

.PHONY: install run test test-deps lint typecheck unit docs bench campaign shim peer-llama llm clean

$(STAMP): pyproject.toml protocol/pyproject.toml client/pyproject.toml protocol/src/npu_protocol/_version.py
	@$(PYTHON) -c 'import ensurepip' 2>/dev/null || { \
		echo "make: $(PYTHON) cannot create a venv: sudo apt-get install python3-venv" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ./protocol -e './client[trio,numpy]' -e '.[test,examples]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	@bash scripts/run-dev.sh "$(SOCKET)" $(ARGS)

# Installs the tools of the tool-backed tests as root; lists what is missing otherwise.
test-deps:
	@bash scripts/test-deps.sh

lint: $(STAMP)
	$(BIN)/python -m ruff check .
	$(BIN)/python -m ruff format --check .

typecheck: $(STAMP)
	$(BIN)/python -m mypy

unit: $(STAMP)
	$(BIN)/python -m pytest -q

test: test-deps lint typecheck unit

# Regenerate the man pages and bash completion from the argparse parsers and the config schema.
docs: $(STAMP)
	$(BIN)/python scripts/generate_docs.py

bench: $(STAMP)
	$(BIN)/python -m bench

# The fault campaign of issue 9 (needs root): see bench/README.md.
campaign: $(STAMP)
	$(BIN)/python -m bench.campaign

# npud's libcdsprpc.so.1, for unmodified FastRPC programs (shim/README.md): shim/build/.
shim:
	$(MAKE) -C shim

# llama.cpp's Hexagon backend built against it, from the llama-cpp-python sdist, cached
# outside the tree, then run through npud on the emulator (scripts/peer-llama.sh --help;
# the first build takes about 10 minutes on 2 cores).
peer-llama: shim $(STAMP)
	bash scripts/peer-llama.sh

# npu_client's load_llm (client/README.md, "LLMs"): the peer build's llama.cpp with its Hexagon
# backend gathered for Python, and llama-cpp-python in .venv without a llama.cpp of its own.
llm: shim $(STAMP)
	bash scripts/peer-llama.sh fetch cpu hexagon llm

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis shim/build
