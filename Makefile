# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create .venv on first use and are fast (no reinstall) once it is up to date.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   ?= demo-output

.PHONY: demo test install clean

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

clean:
	rm -rf $(VENV) $(DEMO)
