# `make run` trains LeNet5 with gradient accumulation and evaluates it; `make test` runs the quick tests (every
# module's unit tests, the equivalence core at K=4, one resume, the README's code blocks with their msrun launch);
# `make test-all` runs every test (what CI runs). Each creates .venv and installs everything the first time.
PYTHON ?= python3
# Another supported MindSpore than the newest, in an environment of its own: `make test MINDSPORE=2.9.0`.
MINDSPORE ?=
VENV := .venv$(if $(MINDSPORE),-mindspore-$(MINDSPORE))
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Real MNIST kept beside the checkout, if this machine has it; otherwise ms-accum looks in ./datasets/MNIST_Data,
# downloads it, and offline falls back to a synthetic MNIST-format set that every output labels SYNTHETIC.
MS_ACCUM_MNIST ?= $(wildcard $(CURDIR)/../shared/data/MNIST_Data)
export MS_ACCUM_MNIST

# The older supported MindSpore releases that CI tests with the quick tier, oldest first (docs/mindspore.md, versions);
# the newest, pyproject.toml's resolution, gets every test.
OLDER_MINDSPORE := 2.8.0 2.9.0

.PHONY: run test test-all ci bench install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test]" $(if $(MINDSPORE),"mindspore==$(MINDSPORE)")
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/ms-accum train --model lenet5 --accumulate-step 4 --batch-size 32 \
		--epochs 1 --ckpt-dir ckpt --download --synthetic-fallback
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/ms-accum eval --model lenet5 --ckpt ckpt/lenet5.ckpt

# Two pytest processes (pytest-xdist), each taking whole test files, so a module's fixtures are computed once: most
# tests compile graphs on one thread, and one process leaves the second core idle. `make test JOBS=0` runs in one.
JOBS ?= 2

test: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q -n $(JOBS) --dist loadfile

# Also the tests marked slow: K=1 and 2, every structure, fault and msrun case, the memory figures, the docs pages'
# code blocks, the tutorials' training runs.
test-all: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q -n $(JOBS) --dist loadfile -m "slow or not slow"

# What CI runs (.ci/run): the quick tier on each older release, each in an environment of its own, then every test on
# the newest; each run leaves its results in .versions/ and tests/test_versions.py compares them, the newest last.
ci:
	for version in $(OLDER_MINDSPORE); do $(MAKE) test MINDSPORE=$$version || exit 1; done
	$(MAKE) test-all

# The lasting benchmark suite (benchmarks/README.md): run it on a quiet machine.
bench: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m benchmarks

clean:
	rm -rf .venv .venv-mindspore-* .versions ckpt/*.ckpt ckpt/*.png
