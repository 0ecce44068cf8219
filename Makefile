# Every target creates/uses .venv and installs what it needs by itself.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.zephon-installed
# The CPU build of torch lies on disk here; pinning it avoids a multi-GB CUDA download.
TORCH   := torch==2.13.0

# Mosaic streaming (compared against in benchmarks/bench_parquet.py) pins numpy and
# transformers below ours: it lives in its own venv, run as a subprocess.
MOSAIC_VENV := .venv-mosaic
MOSAIC_PY   := $(MOSAIC_VENV)/bin/python

.PHONY: test test-fast demo demo-spike demo-kill demo-core demo-hf demo-s3 bench docs docs-serve lint format clean

$(VPY):
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(VPY)
	$(VPY) -m pip install -q "$(TORCH)"
	$(VPY) -m pip install -q -e ".[test,demo]" "$(TORCH)"
	touch $(STAMP)

# the whole suite (what CI runs); pyproject.toml's [tool.pytest.ini_options] holds the
# paths and --doctest-modules, so a plain `pytest` runs the same
test: $(STAMP)
	$(VPY) -m pytest -q -p no:cacheprovider

# the inner loop: everything but the tests that start processes (marked `slow`)
test-fast: $(STAMP)
	$(VPY) -m pytest -q -p no:cacheprovider -m "not slow"

demo: $(STAMP)
	$(VPY) examples/lightning_resume.py

# a loss spike caused by a binary page in a scraped component: find, trace, skip, plot
demo-spike: $(STAMP)
	$(VPY) examples/loss_spike.py

# the same two demos, with the interrupted run killed by SIGKILL mid-run
demo-kill: $(STAMP)
	$(VPY) -m pip install -q -e ".[hf]" "$(TORCH)"
	$(VPY) examples/lightning_resume.py --kill
	$(VPY) examples/hf_trainer_resume.py --kill

demo-core: $(STAMP)
	$(VPY) examples/core_resume_demo.py

demo-hf: $(STAMP)
	$(VPY) -m pip install -q -e ".[hf]" "$(TORCH)"
	$(VPY) examples/hf_trainer_resume.py

# a Lightning job over Parquet shards in a local S3-compatible server, stopped and resumed
demo-s3: $(STAMP)
	cd examples && ../$(VPY) parquet_s3_lightning.py

$(MOSAIC_PY):
	$(PY) -m venv $(MOSAIC_VENV)
	$(MOSAIC_PY) -m pip install -q "mosaicml-streaming==0.13.0" "$(TORCH)" boto3

# every benchmark, then docs/measurements.md rewritten from their tables (date, commit,
# machine, load); BENCH_ARGS="--quick" for a smoke run, "--only throughput,vs_grain" a subset
BENCH_ARGS ?=
bench: $(STAMP) $(MOSAIC_PY)
	$(VPY) -m pip install -q -e ".[bench]" "$(TORCH)"
	MOSAIC_PYTHON=$(MOSAIC_PY) $(VPY) benchmarks/run_all.py $(BENCH_ARGS)

# the documentation site (mkdocs.yml) into site/; `make test` runs the same strict build
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VPY) -m mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VPY) -m mkdocs serve

lint: $(STAMP)
	$(VPY) -m pip install -q ruff
	$(VPY) -m ruff check zephon_core zephon_integrations tests examples benchmarks
	$(VPY) -m ruff format --check zephon_core zephon_integrations tests examples benchmarks

format: $(STAMP)
	$(VPY) -m pip install -q ruff
	$(VPY) -m ruff format zephon_core zephon_integrations tests examples benchmarks
	$(VPY) -m ruff check --fix zephon_core zephon_integrations tests examples benchmarks

clean:
	rm -rf $(VENV) $(MOSAIC_VENV)
