# The README's two commands. Both create .venv on first use; nothing else is needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DATA ?= $(firstword $(wildcard ../shared/data/mnist) $(EC2GPU_DATA_DIR))

.PHONY: demo test test-fast lint install clean bench docs

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch 2.13.0 first: on these machines it is a CPU build on disk; unpinned, pip would fetch GBs of CUDA.
	$(BIN)/pip install -q "torch==2.13.0"
	# the tests need every extra: the trainer, the sandbox (moto's server), JupyterLab and the test tools
	$(BIN)/pip install -q -e ".[train,sandbox,notebook,pool,dev]"
	touch $@

install: $(BIN)/.installed

demo: install
	EC2GPU_DATA_DIR=$(abspath $(DATA)) $(BIN)/ec2gpu train mnist --sandbox

# three test processes side by side (pytest-xdist; a module and its sandbox stay on one), then the
# modules marked `alone` by themselves (tests/conftest.py says which go first, and why)
# (--no-loadscope-reorder: in that order, not xdist's most-tests-first); both parts run, either failing fails
test: install lint
	status=0; \
	EC2GPU_DATA_DIR=$(abspath $(DATA)) $(BIN)/python -m pytest -q --durations=10 -n 3 --dist loadfile --no-loadscope-reorder -m "not alone" || status=$$?; \
	EC2GPU_DATA_DIR=$(abspath $(DATA)) $(BIN)/python -m pytest -q --durations=5 -m alone || status=$$?; \
	exit $$status

lint: install  # ruff.toml and mypy.ini, checked in (issue 29, item 8)
	$(BIN)/ruff check .
	$(BIN)/mypy

# the pure, AWS-layer and SSH-layer tests only, two processes side by side; `make test` runs everything.
# --dist loadfile (here and above): a module's tests stay in one process, in order; the SSH-layer
# modules name their sandbox instances (tests/remote), and one process's sshd.stop ends that name's processes
test-fast: install
	EC2GPU_DATA_DIR=$(abspath $(DATA)) $(BIN)/python -m pytest -q --durations=10 -n 2 --dist loadfile tests/unit tests/aws tests/remote

# the documentation site from docs/ (mkdocs.yml) into site/; tests/unit/test_docs_site.py builds it --strict
docs: install
	$(BIN)/mkdocs build --strict

bench: install
	$(BIN)/python scripts/bench_trainer.py --data-dir $(abspath $(DATA))

clean:
	rm -rf $(VENV) runs site .pytest_cache
