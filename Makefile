# Train Faster: two commands do everything.
#   make book   build the site, every chapter executed, into _build/html
#   make test   run the tests (listings, parity with torch, chapters executed, workflows)
# Both create the project environment (.venv) on first use and reuse it after.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: book test lint measure gpu-plan gpu-pass gpu-wheels clean

# uv installs the same pinned environment as pip does (the same versions, checked on
# 2026-11-26) in about 40 s instead of about 180 s: it downloads, unpacks and compiles in
# parallel. --compile-bytecode, as pip does: where PYTHONDONTWRITEBYTECODE is set (the book's
# build machine), a module never compiled at install is compiled again in every process that
# imports it (a chapter that starts torchrun took 46 s instead of 28). uv reads PyPI, not
# pip.conf: with another index, set UV_DEFAULT_INDEX.
UV := uv==0.13.9

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(UV)
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -r requirements.txt
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

# Both use every core: the build executes the outdated chapters BOOK_JOBS at a time while
# Sphinx reads the other pages (book/_ext/build_support/execution_cache.py; empty = the CPU
# count), and the tests run on TEST_JOBS pytest-xdist workers, tests that need something
# exclusive grouped (tests/conftest.py). BOOK_JOBS=1 TEST_JOBS=0 is the serial build and test run.
BOOK_JOBS ?=
TEST_JOBS ?= auto

book: $(STAMP)
	TRAINFAST_BUILD_JOBS=$(BOOK_JOBS) $(BIN)/jupyter-book build . -W -n --keep-going

test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadgroup $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check code tests

# Write measurement records for this machine into book/records (run on the GPU runner too).
# ONLY=name (or "a b") measures those benchmarks alone, e.g. make measure ONLY=speedrun.
ONLY ?=
measure: $(STAMP)
	$(BIN)/python -m trainfast.measure --out book/records $(if $(ONLY),--only $(ONLY))

# The GPU pass, planned for the device time (README, "The GPU pass"). Here: `make gpu-plan`
# prints its two commands, each step with its estimated seconds and their source, and fails if
# they do not fit GPU_BUDGET seconds of device time. There, with .whl carried: `make gpu-pass`
# runs command GPU_PASS_COMMAND (1: every page and GPU test, 8 at a time; 2: the speedrun, then
# the stale records, then the other benchmarks) with the machine's own python3 and the wheels
# from .whl/ on PYTHONPATH, as .ci/gpu-call.sh does; DEVICE=cpu is the dry run of the same plan.
GPU_BUDGET       ?= 900
GPU_PASS_COMMAND ?= 1
gpu-plan:
	PYTHONPATH="$(CURDIR)/code:$$PYTHONPATH" $(PYTHON) -m trainfast.gpu_pass --plan \
	  --budget $(GPU_BUDGET)

gpu-pass:
	GPU_PASS_BUDGET=$(GPU_BUDGET) PYTHON=$(PYTHON) bash .ci/gpu-call.sh $(GPU_PASS_COMMAND)

# The wheels the GPU machine lacks for the pass (.ci/gpu-wheels.txt), into .whl/, and the commit
# of this checkout into .whl/COMMIT, marked +dirty as trainfast.records.source_commit marks it
# (the copy there has no .git; .ci/gpu-call.sh exports it as TRAINFAST_COMMIT for the records).
# Run it again after the last commit before a device call.
WHEEL_PYTHON ?= 3.12
WHEELHOUSE   ?= .whl
gpu-wheels:
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: \
	  --python-version $(WHEEL_PYTHON) --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
	  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  --platform manylinux1_x86_64 -d $(WHEELHOUSE) -r .ci/gpu-wheels.txt
	echo "$$(git rev-parse HEAD)$$(git status --porcelain --untracked-files=no -- code | \
	  grep -q . && echo +dirty)" > $(WHEELHOUSE)/COMMIT
	@du -ch $(WHEELHOUSE)/*.whl | tail -1

clean:
	rm -rf _build
