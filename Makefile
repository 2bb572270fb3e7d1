# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create .venv on first use (1 min 14 s here, 4.3 GB); `make test` also creates .venv-mf
# (MindFormers 1.9.0, MindSpore 2.9, numpy<2, transformers, torch: 2 min 49 s here, 4.6 GB) before the suite.
# Each is fast (no reinstall) once it is up to date with pyproject.toml.
# Test tiers: `make test` everything (CI); `make test-fast` the edit-run loop (no `slow`, no `fuzz`
# markers); `make test-pure` the tests that need no MindSpore, in a venv without it. `make lint`
# (ruff + mypy, configured in pyproject.toml) runs first in `make test` and `make test-fast`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   ?= demo-output

PURE   := .venv-pure
# MindFormers 1.9.0 (the real client of the Hugging Face route) pins mindspore~=2.9.0 and needs numpy<2: its own venv, made by `make venv-mf`
# (or by `make test`, which then runs tests/mindspore/test_mindformers_client.py and tests/mindspore/test_mindformers_recipe.py inside it as a subprocess).
MF     := .venv-mf

.PHONY: demo lint test test-fast test-pure test-mf venv-mf install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[mindspore,test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	GLOG_v=3 $(PY) -m ckptstore.demo $(DEMO)

lint: $(STAMP)
	$(VENV)/bin/ruff check ckptstore tests benchmarks
	$(VENV)/bin/mypy ckptstore

# Two pytest workers (pytest-xdist), a test file each at a time (its module fixtures built once): the
# msrun jobs, servers and subprocesses of one file wait while the other file's tests run.
TEST_JOBS ?= 2

test: $(STAMP) $(MF)/.installed lint
	GLOG_v=3 $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_JOBS) --dist loadfile tests

test-fast: $(STAMP) lint
	GLOG_v=3 $(PY) -m pytest -q -p no:cacheprovider -m "not slow and not fuzz" --hypothesis-profile=fast tests

# The pure tier: every test not marked mindspore (fixtures by ckptstore's writers, byte-identical
# to MindSpore's: tests/testing/test_pure_fixtures.py), in a venv without MindSpore: proves those
# parts need none. Tests whose expected values or input only MindSpore gives skip there.
$(PURE)/.installed: pyproject.toml
	$(PYTHON) -m venv $(PURE)
	$(PURE)/bin/python -m pip install --quiet --upgrade pip
	$(PURE)/bin/python -m pip install --quiet -e '.[test]'
	touch $@

test-pure: $(PURE)/.installed
	$(PURE)/bin/python -m pytest -q -p no:cacheprovider -m "not mindspore" tests

$(MF)/.installed: pyproject.toml
	$(PYTHON) -m venv $(MF)
	$(MF)/bin/python -m pip install --quiet --upgrade pip
	$(MF)/bin/python -m pip install --quiet 'mindformers==1.9.0' 'mindspore~=2.9.0' 'numpy<2' \
		'transformers>=4.45' 'torch==2.13.0' -e '.[test]'
	touch $@

venv-mf: $(MF)/.installed

# The MindFormers real-client tests, in .venv-mf (tests/mindspore/test_mindformers_client.py skips outside it).
test-mf: $(MF)/.installed
	GLOG_v=3 $(MF)/bin/python -m pytest -q -p no:cacheprovider tests/mindspore/test_mindformers_client.py tests/mindspore/test_mindformers_recipe.py

clean:
	rm -rf $(VENV) $(PURE) $(MF) $(DEMO)
