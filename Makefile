PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Reinstall only when the project metadata changes: pyproject.toml, constraints.txt (the dev environment's
# pins), or host/codemode/__init__.py (the version source, read by pyproject); the stamp is newer otherwise.
STAMP := $(VENV)/.installed
# Every optional extra (pyproject.toml) and the dev tools: the tests exercise them all.
EXTRAS := dev,kubernetes,tracing

.PHONY: venv run test lint format typecheck bench clean constraints

$(BIN)/python:
	@echo "[make] creating $(VENV) with $(PY)" >&2
	@$(PY) -m venv $(VENV)
	@echo "[make] upgrading pip" >&2
	@$(BIN)/pip install -q --upgrade pip > $(VENV)/install.log 2>&1 || { cat $(VENV)/install.log >&2; exit 1; }

$(STAMP): pyproject.toml constraints.txt host/codemode/__init__.py | $(BIN)/python
	@echo "[make] installing codemode, all its extras and its dev tools into $(VENV), pinned by constraints.txt (again only when pyproject.toml, constraints.txt or host/codemode/__init__.py changes)" >&2
	@$(BIN)/pip install -q -c constraints.txt -e '.[$(EXTRAS)]' > $(VENV)/install.log 2>&1 || { cat $(VENV)/install.log >&2; exit 1; }
	@# The three package roots on sys.path as plain folders, as an installed wheel's packages are: the
	@# editable install's import hook comes after the path search, where a folder named codemode/
	@# beside a script would otherwise win as a namespace package.
	@$(BIN)/python -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "codemode-roots.pth").write_text("".join(str(pathlib.Path(r).resolve()) + "\n" for r in ("host", "worker_image", "capabilities")))'
	@touch $(STAMP)
	@echo "[make] $(VENV) is ready" >&2

venv: $(STAMP)

# stdout is the MCP stream: every install message goes to stderr and make echoes no command.
run:
	@$(MAKE) --no-print-directory -s venv >&2
	@exec $(BIN)/codemode serve --stdio --allow-all --pack codemode_capabilities.records:pack

lint: venv
	$(BIN)/ruff check host worker_image capabilities tests examples
	$(BIN)/ruff format --check host worker_image capabilities tests examples
	$(BIN)/mypy host worker_image capabilities tests

format: venv
	$(BIN)/ruff format host worker_image capabilities tests examples
	$(BIN)/ruff check --fix host worker_image capabilities tests examples

test: venv lint
	$(BIN)/python -m pytest -q -rfEs --durations=25 tests

# After an upgrade you mean to keep: pin what the venv now has (scripts/freeze_constraints.py).
constraints: venv
	$(BIN)/python scripts/freeze_constraints.py

bench: venv
	$(BIN)/codemode bench --runtime process --pool 4

clean:
	rm -rf $(VENV) build *.egg-info
