# The commands of the README and the documentation site (docs/). Each target creates .venv when it is missing (or older than pyproject.toml).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CLI := $(VENV)/bin/trtllm-pipeline
CONFIG ?= build_configs/tiny-cpu.yaml
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test unit lint format typecheck docs bench venv schema clean compose-e2e dist

demo: $(STAMP)
	$(CLI) validate $(CONFIG)
	$(CLI) run $(CONFIG)
	$(CLI) status $(CONFIG)
	$(CLI) generate $(CONFIG) --prompt 'def __init__(self' --max-tokens 48
	$(CLI) serve $(CONFIG) --detach
	status=0; \
	for prompt in 'import' 'class Parser' 'def __init__(self'; do \
	  printf '\n[gRPC, streamed] %s' "$$prompt"; \
	  $(CLI) infer "$$prompt" --protocol grpc --stream --max-tokens 40 || status=$$?; \
	done; \
	printf '\n[HTTP] def main('; \
	$(CLI) infer 'def main(' --protocol http --max-tokens 40 || status=$$?; \
	$(CLI) stop $(CONFIG) || status=$$?; \
	exit $$status

test: lint docs
	$(PY) -m pytest -q --durations=40

# The fast loop: every test that starts no tritonserver and is not marked slow (a ModelOpt calibration, a full CLI
# run: each over ~3 s here); `make test` runs every test. docs/development.md says how to run one folder or the slow ones.
unit: $(STAMP)
	$(PY) -m pytest -q -m 'not integration and not slow' --ignore=tests/integration -p no:cacheprovider

# The project's rules as tools (pyproject.toml: [tool.ruff], [tool.importlinter], [tool.mypy]); `make test` runs them
# first: lint and format, the import layers, the types, and the repository's own rules (modules under 400 lines, no
# citation of a file the repository does not hold), each failure naming its file.
LINTED := pipeline bench clients refengine model_repo scripts tests
lint: $(STAMP) typecheck
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -p no:cacheprovider tests/repo/test_structure.py tests/repo/test_citations.py

# model_repo/python is a second run: Triton imports its files as top-level modules (pyproject.toml [tool.mypy]).
typecheck: $(STAMP)
	$(VENV)/bin/mypy pipeline bench refengine clients
	$(VENV)/bin/mypy model_repo/python

# Applies the formatter `make lint` checks.
format: $(STAMP)
	$(VENV)/bin/ruff format $(LINTED)
	$(VENV)/bin/ruff check --fix $(LINTED)

# The documentation site (mkdocs.yml) into site/; --strict: a broken link, page or anchor fails it (`make test` runs it).
# NO_MKDOCS_2_WARNING silences the Material theme's end-of-life notice, printed on every build (docs/development.md).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d site

bench: $(STAMP)
	$(CLI) bench engine $(CONFIG)
	$(CLI) bench load $(CONFIG) --endpoint grpc,openai --concurrency 1,2,4,8 --requests 48 --warmup 4 \
	  --input-tokens 128 --output-tokens 64 --slo-ttft-ms 250 --slo-itl-ms 40

# Opt-in, not in CI: the cpu compose deployment on this Docker host without registry access (scripts/compose_e2e.sh).
compose-e2e: $(STAMP)
	CLI=$(CURDIR)/$(CLI) bash scripts/compose_e2e.sh

venv: $(STAMP)

# The sdist and, built from it, the wheel (pipeline, refengine, clients, model_repo with its templates and model code).
# tests/integration/test_wheel_install.py installs such a wheel into a fresh environment and runs it from elsewhere.
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist .

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and pinned, so that nothing later resolves a CUDA build
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	scripts/fetch_compose_schema.sh $(VENV)
	touch $(STAMP)

schema: $(STAMP)
	$(CLI) schema --write
	$(PY) scripts/update_docs_reference.py

clean:
	rm -rf artifacts
