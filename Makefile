# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create .venv on first use and are fast (no reinstall) once it is up to date.
# Test tiers: `make test` everything (CI); `make test-fast` the edit-run loop (no `slow`, no `fuzz`
# markers); `make test-pure` the tests that need no MindSpore, in a venv without it.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   ?= demo-output

PURE   := .venv-pure

.PHONY: demo test test-fast test-pure install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[mindspore,test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	GLOG_v=3 $(PY) -m ckptstore.demo $(DEMO)

test: $(STAMP)
	GLOG_v=3 $(PY) -m pytest -q -p no:cacheprovider tests

test-fast: $(STAMP)
	GLOG_v=3 $(PY) -m pytest -q -p no:cacheprovider -m "not slow and not fuzz" --hypothesis-profile=fast tests

# The pure tier (box math, layouts, chunk plan, planner and executor, manifest, the wire and .ckpt
# record parsers, rank-file choice, CLI usage, S3 errors) in a venv
# without MindSpore: proves those parts need none. Everything else skips there.
$(PURE)/.installed: pyproject.toml
	$(PYTHON) -m venv $(PURE)
	$(PURE)/bin/python -m pip install --quiet --upgrade pip
	$(PURE)/bin/python -m pip install --quiet -e '.[test]'
	touch $@

test-pure: $(PURE)/.installed
	$(PURE)/bin/python -m pytest -q -p no:cacheprovider -m "not mindspore" tests

clean:
	rm -rf $(VENV) $(PURE) $(DEMO)
