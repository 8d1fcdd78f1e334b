# `make run` trains LeNet5 with gradient accumulation and evaluates it; `make test` runs the tests.
# Both create .venv and install everything the first time.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/ms-accum train --model lenet5 --accumulate-steps 4 --batch-size 32 \
		--epochs 1 --ckpt-dir ckpt --download
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/ms-accum eval --model lenet5 --ckpt ckpt/lenet5.ckpt

test: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) ckpt/*.ckpt ckpt/*.png
