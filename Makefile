# Two commands on a fresh machine:  `make run` (platform on embedded defaults) and `make test` (lint, then the
# whole suite).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)

# Tests run against PostgreSQL and Redis on this machine unless told otherwise.
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres
TEST_REDIS_URL ?= redis://127.0.0.1:6379/1

.PHONY: setup frontend run lint test bench bench-slots bench-rollout bench-learning bench-async bench-events bench-dashboard clean

$(BIN)/.installed: requirements.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt
	touch $@

setup: $(BIN)/.installed frontend

# Dashboard assets: npm packages from package-lock.json, bundled by esbuild into frontend/static/dist (gitignored).
node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

frontend: node_modules/.installed
	node frontend/build.mjs

# Quiet by default (children's chatter goes to var/logs/); `make run ARGS=--verbose` or `VERBOSE=1 make run` shows all.
run: setup
	$(BIN)/python platform/up.py $(ARGS)

# The tools that keep the design (configured in pyproject.toml, mypy.ini, tsconfig.json): style, the import
# contracts (docs/README.md), types (rollout/ and trainer/ strict; runs/ and config/ with django-stubs), TypeScript.
lint: $(BIN)/.installed node_modules/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	DJANGO_DEBUG=1 $(BIN)/python -m mypy rollout trainer agents client runs config
	DJANGO_DEBUG=1 DATABASE_URL=sqlite:///:memory: $(BIN)/python manage.py makemigrations --check --dry-run
	node_modules/.bin/tsc --noEmit -p tsconfig.json

# Tests marked `beside` start their own platform, Ray head or databases and share nothing with the rest: they run
# in a second pytest beside the suite, with its own database and Redis db, and its output follows the suite's.
# Either one failing fails `make test`. They are the Ray-outage acceptance (tests/execution/test_outage.py: it
# mostly waits out two 3-minute outages of its own Ray head), the restarts of `make run` (tests/test_restart.py),
# up.py's own checks (tests/test_platform_quiet.py, tests/security/test_platform_up.py) and the multi-process
# slot stress (tests/runs/test_stress.py, on databases of its own): about 7 minutes of the suite's 37 here, which
# keeps about one of the two cores busy on average, so the second pytest mostly uses the idle one.
# A test that times runs against a baseline (tests/test_capacity.py) holds the tests beside back while it runs
# (tests/quiet.py), and every platform a test starts gets a free dashboard port, never Ray's 8265.
# `PYTEST_CPU_ACCOUNT=var/cpu.txt make test` also writes the CPU each test cost (tests/cpu_account.py; root and a
# cgroup v1 cpuacct hierarchy needed), the second pytest's to var/cpu.txt.beside.
TEST_BESIDE_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/root
TEST_BESIDE_REDIS_URL ?= redis://127.0.0.1:6379/2

test: setup lint
	@mkdir -p var; \
	DATABASE_URL=$(TEST_BESIDE_DATABASE_URL) REDIS_URL=$(TEST_BESIDE_REDIS_URL) \
	  PYTEST_CPU_ACCOUNT=$${PYTEST_CPU_ACCOUNT:+$$PYTEST_CPU_ACCOUNT.beside} \
	  $(BIN)/python -m pytest -m beside $(PYTEST_ARGS) > var/test-beside.log 2>&1 & beside=$$!; \
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(BIN)/python -m pytest -m "not beside" $(PYTEST_ARGS); \
	suite=$$?; wait $$beside; beside_rc=$$?; \
	echo "--- the tests marked beside (ran in a second pytest beside the suite) ---"; cat var/test-beside.log; \
	test $$suite -eq 0 && test $$beside_rc -eq 0

bench-slots: setup
	DATABASE_URL=$(TEST_DATABASE_URL) $(BIN)/python bench/slots.py $(BENCH_ARGS)

bench-rollout: setup
	$(BIN)/python bench/rollout.py $(BENCH_ARGS)

bench-learning: setup
	$(BIN)/python bench/learning.py $(BENCH_ARGS)

bench-async: setup
	$(BIN)/python bench/async.py $(BENCH_ARGS)

bench-dashboard: setup
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(BIN)/python bench/dashboard.py $(BENCH_ARGS)

bench-events: setup
	$(BIN)/python bench/events.py $(BENCH_ARGS)

clean:
	rm -rf var
