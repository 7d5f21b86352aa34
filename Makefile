PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: venv run test lint typecheck bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

venv: $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'

# stdout is the MCP stream: install quietly with every message on stderr, echo no command.
run:
	@$(MAKE) --no-print-directory -s venv >&2
	@exec $(BIN)/codemode serve --stdio --allow-all --pack codemode.capabilities.records:pack

lint: venv
	$(BIN)/ruff check host worker_image capabilities tests
	MYPY=$(BIN)/mypy scripts/typecheck.sh

test: venv lint
	$(BIN)/python -m pytest -q tests

bench: venv
	$(BIN)/codemode bench --runtime process --pool 4

clean:
	rm -rf $(VENV) build *.egg-info
