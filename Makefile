# Two commands matter: `make run` and `make test`. Everything else is a one-line wrapper.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
HOST   ?= 127.0.0.1
PORT   ?= 8000
# Parallel test runners (pytest-xdist): the suite mostly waits on real workers, servers and
# browsers, so more runners than cores pay off. TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 4

.PHONY: install run test lint format migrate worker beat bench fuzz conformance

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP)

# The real OpenID Connect provider the sign-in tests run on loopback (tests/support/oidc.py).
OIDC_PROVIDER := tests/support/oidc_provider
$(OIDC_PROVIDER)/node_modules/.installed: $(OIDC_PROVIDER)/package-lock.json
	npm ci --prefix $(OIDC_PROVIDER) --no-audit --no-fund --loglevel=error
	@touch $@

run: install migrate
	$(PY) manage.py seed_demo
	$(PY) manage.py runstack --host $(HOST) --port $(PORT)

test: install $(OIDC_PROVIDER)/node_modules/.installed
	$(PY) manage.py collectstatic --noinput -v0
	@# Every worker, web and sandboxed server a test starts imports the project: with bytecode
	@# cached (PYTHONDONTWRITEBYTECODE cleared) none of them compiles it again.
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

migrate: install
	$(PY) manage.py migrate --noinput

worker: install
	$(VENV)/bin/celery -A config worker --loglevel INFO

beat: install
	$(VENV)/bin/celery -A config beat --loglevel INFO

bench: install  # figures on SQLite and PostgreSQL + Redis (docs/bench.md); BENCH_ARGS=--quick
	$(PY) -m bench $(BENCH_ARGS)

fuzz: install  # schemathesis against the live stack (needs PostgreSQL + Redis on loopback)
	tests/schemathesis/run.sh

conformance: install  # the MCP client conformance suite (npm, pinned) against manage.py mcp_probe; needs Node 20+
	$(PY) tests/conformance/run.py $(CONFORMANCE_ARGS)
