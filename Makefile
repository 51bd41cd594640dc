# Every target sets up what it needs into .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU build of torch: a pinned version keeps pip from resolving a CUDA build on machines
# without a GPU. Users with CUDA set TORCH_SPEC (for example TORCH_SPEC="torch") themselves.
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev,ray,warp,offline,viz,export,wandb,docs
comma  := ,
STAMP  := $(VENV)/.myriad-installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: install install-gpu demo test lint docs bench gpu-check gpu-bundle clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[$(EXTRAS)]"
	touch $@

install: $(STAMP)

# GPU faiss without two copies of the `faiss` module: remove faiss-cpu, then install faiss-gpu
# alone (see docs/install.md).
install-gpu: $(STAMP)
	$(BIN)/pip install -q -e ".[gpu]"
	$(BIN)/pip uninstall -q -y faiss-cpu faiss-gpu
	$(BIN)/pip install -q --no-deps faiss-gpu
	$(BIN)/myriad doctor

# The main job on the built-in default: K-Myriad pretraining on the maze.
demo: $(STAMP)
	$(BIN)/myriad pretrain

# lint-imports checks that the packages' layers point one way (the contract in pyproject.toml);
# mypy type-checks the package ([tool.mypy] in pyproject.toml).
# The video tests render MuJoCo frames headless: Mesa's EGL is installed first when absent.
test: $(STAMP)
	bash scripts/ensure-headless-gl.sh
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(MAKE) docs
	$(BIN)/python -m pytest -n 2 -q tests

# mypy type-checks the package with the settings in pyproject.toml ([tool.mypy]).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

# The API reference from the docstrings into site/ (mkdocs.yml), warnings as errors: a broken
# docstring or reference fails the build. `$(BIN)/mkdocs serve` shows it while editing.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --quiet

bench: $(STAMP)
	$(BIN)/myriad bench envs
	$(BIN)/myriad bench knn

# Every CUDA path end to end in minutes (docs/benchmarks.md); without a GPU it says so and
# exits 0. The faiss-gpu stage needs `make install-gpu` first.
gpu-check: $(STAMP)
	$(BIN)/myriad bench gpu

# The wheels a CUDA node without network needs for the GPU check (docs/install.md); there:
# `scripts/gpu-check.sh` with the node's own Python and PyTorch. GPU_PYTHON=3.12 for the node's
# Python version.
gpu-bundle:
	PYTHON=$(PYTHON) bash scripts/gpu-bundle.sh

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache site
