# shardspec developer tasks. `make demo` and `make test` set everything up on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stamp
PIP := $(BIN)/python -m pip -qq --disable-pip-version-check
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs

# Without an NVIDIA driver, pin the CPU build of torch that lies on this machine's disk; an
# unpinned torch would pull a multi-GB CUDA build.
TORCH := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)

.PHONY: venv toolchains demo test docs lint typecheck bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "installing $(TORCH) into $(VENV)"
	$(PIP) install '$(TORCH)'
	@echo "installing shardspec (editable) with test, docs and s3 extras"
	$(PIP) install -e '.[test,docs,s3]'
	@touch $(STAMP)

# The conformance examples in other languages (conformance/examples/rust, .../node) are built
# and run by the tests: cargo, and Node.js with npm, from Debian's packages where missing.
toolchains:
	@command -v cargo >/dev/null 2>&1 || { echo "installing cargo (Debian)"; apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cargo >/dev/null; }
	@command -v npm >/dev/null 2>&1 || { echo "installing nodejs and npm (Debian)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm \
		>/dev/null; }

demo: venv
	$(BIN)/python examples/demo.py

test: venv toolchains
	$(BIN)/ruff check .
	$(MKDOCS) build --strict --quiet
	$(BIN)/python -m pytest

# The documentation site, into site/; --strict: a broken link or a missing page fails it.
docs: venv
	$(MKDOCS) build --strict

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy

typecheck: venv
	$(BIN)/mypy

bench: venv
	$(BIN)/python benchmarks/bench_load.py

clean:
	rm -rf $(VENV) dist build demo-checkpoint dist-checkpoint benchmarks/out .pytest_cache .ruff_cache \
		.mypy_cache .hypothesis site
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
	find . -name '*.egg-info' -type d -prune -exec rm -rf {} +
