# The two commands the README promises. Each sets everything up by itself (scripts/setup.sh).
.PHONY: lab test setup
VENV ?= .venv
PORT ?= 8888
LAB_ARGS ?=
# Jupyter refuses to start as root without this (containers, CI, cloud notebooks often run as root).
ROOT_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root,)
PYTEST_ARGS ?=

# The folder `make lab` opens: nvkit-tutorials/ in this checkout, git-ignored, the same folder
# `nvkit lab` uses by default. `nvkit lab` copies the tutorials in (never over a copy already there)
# and the Launcher copies into it, so running a tutorial writes outputs into a copy, never into the
# tracked notebooks/ (kept clean for the tests and for diffs). In the checkout rather than in
# ~/nvkit-notebooks: the copies come from this checkout's tutorials and go away with it, and copies
# from two checkouts never mix. notebooks/jupytext.toml lies outside this folder, so the copies are
# plain notebooks without src/ pairs (a jupytext.toml of your own in a folder pairs what is there).
WORKDIR ?= nvkit-tutorials

setup:
	bash scripts/setup.sh

## make lab: set up, then open JupyterLab in $(WORKDIR) with the tutorials (the demo model needs no network or GPU)
lab: setup
	$(VENV)/bin/nvkit lab --dir $(WORKDIR) --port=$(PORT) $(ROOT_ARGS) $(LAB_ARGS)

## make test: set up, then run the whole test suite (GPU tests skip with a reason without CUDA);
## scripts/test.sh says how it is split (browser tests alone, the rest over two workers)
test: setup
	VENV=$(VENV) bash scripts/test.sh $(PYTEST_ARGS)
