# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create .venv on first use and are fast (no reinstall) once it is up to date.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   ?= demo-output

PURE   := .venv-pure

.PHONY: demo test test-pure install clean

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

# The pure tier (box math, chunk plan, planner and executor, manifest, wire parser) in a venv
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
