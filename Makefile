# The two commands the README promises. Each sets everything up by itself (scripts/setup.sh).
.PHONY: lab test setup
VENV ?= .venv
PORT ?= 8888
LAB_ARGS ?=
# Jupyter refuses to start as root without this (containers, CI, cloud notebooks often run as root).
ROOT_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root,)
PYTEST_ARGS ?=

setup:
	bash scripts/setup.sh

## make lab: set up, then open JupyterLab on the tutorials (the demo model needs no network or GPU)
lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --port=$(PORT) $(ROOT_ARGS) $(LAB_ARGS)

## make test: set up, then run the whole test suite (GPU tests skip with a reason without CUDA);
## scripts/test.sh says how it is split (browser tests alone, the rest over two workers)
test: setup
	VENV=$(VENV) bash scripts/test.sh $(PYTEST_ARGS)
