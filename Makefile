# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

AOT_VENV := .venv-aot
AOT_STAMP := $(AOT_VENV)/.installed

# Test files run in this many processes (pytest-xdist, a file's tests together so that its
# compiled fixtures are shared): in one process the suite keeps only ~1.3 of 2 cores busy.
TEST_WORKERS ?= 2
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist loadfile

.PHONY: venv aot-venv demo ablations retrieval-example smoke test test-all test-aot wheel-check bench clean

# Creates or updates .venv only when requirements.txt or pyproject.toml changed.
venv: $(STAMP)

$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.txt
	$(PY) -m pip install --disable-pip-version-check -q --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install --disable-pip-version-check -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

# The main job: fine-tune MiniLM with RankGen's objective on the bundled books (~10 min
# of training), evaluate against its zero-shot self and the unigram baseline, plot, export.
demo: venv
	.venv/bin/rankgen-jax train

# The CPU ablation grid (gin_configs/ablations/grid_demo_cpu.json: MiniLM, one factor at a time around the demo's
# settings, step budgets) and its report, each run against the baseline item by item with standard errors:
# runs/ablations/report/ablations.{md,png,json} (docs/ablations.md has a measured one). A rerun resumes.
ablations: venv
	.venv/bin/rankgen-jax sweep --grid ablations/grid_demo_cpu.json --workdir runs/ablations --report_dir runs/ablations/report

# BEIR folder from the books -> MiniLM in-batch -> BM25 negatives -> hard-negative training -> 2-shard index,
# TREC run, nDCG@10 / RR@10 / R@100 on the test books (runs/retrieval_example/retrieval_table.md).
retrieval-example: venv
	.venv/bin/rankgen-jax retrieval-example --workdir runs/retrieval_example

# Quick check of the model core: random T5 -> checkpoint -> HF export -> same vectors in PyTorch.
smoke: venv
	$(PY) -m rankgen_jax.experiments.smoke --out runs/smoke

# .venv plus libtpu (~0.7 GB, Linux x86_64 only), for compiling against TPU topologies on CPU.
aot-venv: $(AOT_STAMP)

$(AOT_STAMP): $(STAMP) requirements-tpu.txt tpu_scripts/aot_venv.sh
	bash tpu_scripts/aot_venv.sh
	touch $(AOT_STAMP)

# The suite, then tests/test_aot.py again in .venv-aot, where its TPU compiles run instead of skipping.
test: venv
	$(PY) -m pytest -q $(PYTEST_PARALLEL) -m "not slow" --durations=25 tests
	@$(MAKE) --no-print-directory test-aot AOT_MARKS='-m "not slow"'

test-all: venv
	$(PY) -m pytest -q $(PYTEST_PARALLEL) tests
	@$(MAKE) --no-print-directory test-aot

test-aot:
	@if [ "$$(uname -s -m)" = "Linux x86_64" ]; then \
		$(MAKE) -s --no-print-directory aot-venv && $(AOT_VENV)/bin/python -m pytest -q $(AOT_MARKS) tests/test_aot.py; \
	else echo "skipping the TPU compile tests: libtpu installs only on Linux x86_64"; fi

# The pip package as a user gets it: the wheel, installed with its dependencies into a clean venv
# (.wheel-check/), then `rankgen-jax --help`, a tiny train and export there (tests/wheel_check.sh; CI runs it).
wheel-check: venv
	bash tests/wheel_check.sh

clean:
	rm -rf runs .pytest_cache .wheel-check

bench: venv
	$(PY) -m benchmarks.bench --out runs/bench/bench.json
