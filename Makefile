# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo smoke test test-all bench clean

# Creates or updates .venv only when requirements.txt or setup.py changed.
venv: $(STAMP)

$(STAMP): requirements.txt requirements-nodeps.txt setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.txt
	$(PY) -m pip install --disable-pip-version-check -q --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install --disable-pip-version-check -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

# The main job: fine-tune MiniLM with RankGen's objective on the bundled books (~10 min
# of training), evaluate against its zero-shot self and the unigram baseline, plot, export.
demo: venv
	.venv/bin/rankgen-jax train

# Quick check of the model core: random T5 -> checkpoint -> HF export -> same vectors in PyTorch.
smoke: venv
	$(PY) -m rankgen_jax.smoke --out runs/smoke

test: venv
	$(PY) -m pytest -q -m "not slow" --durations=25 tests

test-all: venv
	$(PY) -m pytest -q tests

clean:
	rm -rf runs .pytest_cache

bench: venv
	$(PY) -m rankgen_jax.bench --out runs/bench/bench.json
