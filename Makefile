# The two commands the README opens with: `make serve` and `make test`.
VENV ?= .venv
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: setup serve test check unit bench clean

setup:
	VENV=$(VENV) scripts/setup

serve: setup
	HF_HUB_OFFLINE=1 $(VENV)/bin/modelyard serve --host $(HOST) --port $(PORT)

test: setup
	VENV=$(VENV) scripts/check

check:
	VENV=$(VENV) scripts/check

unit:
	VENV=$(VENV) scripts/check -m unit

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
