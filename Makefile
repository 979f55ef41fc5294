# cdc-router: `make help` lists the targets.
PYTHON ?= python3
CDC := $(PYTHON) -m cdc_router
APT_PACKAGES := postgresql-15 openjdk-17-jre-headless maven redis-server nats-server docker-compose python3-pip prometheus

.DEFAULT_GOAL := help
.PHONY: help system-deps install stack test test-unit test-integration lint typecheck demo bench bench-router bench-scale bench-memory bench-avro clean
.PHONY: chaos chaos-short bytecode
.PHONY: up down compose-config

help: ## Show this help
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-18s %s\n", $$1, $$2}'

system-deps: ## Install Postgres 15, Java 17, Maven, Redis, nats-server, pip, promtool (Debian packages; needs root)
	@if [ "$$(id -u)" = 0 ]; then \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --no-upgrade $(APT_PACKAGES) >/dev/null; \
	else \
		for tool in java mvn redis-server; do command -v $$tool >/dev/null || { echo "missing $$tool: run 'sudo make system-deps'"; exit 1; }; done; \
		ls /usr/lib/postgresql/15/bin/postgres >/dev/null || { echo "missing postgresql-15: run 'sudo make system-deps'"; exit 1; }; \
		command -v nats-server >/dev/null || test -x /usr/sbin/nats-server || { echo "missing nats-server: run 'sudo make system-deps'"; exit 1; }; \
	fi

# Debian's own python3 is externally managed (PEP 668): pip refuses to install into it unless
# told to. For a virtualenv instead, run make with PYTHON=path/to/venv/bin/python.
install: system-deps ## Install the package with its dev extra
	@flag=; if $(PYTHON) -c "import os, sys, sysconfig; sys.exit(sys.prefix != sys.base_prefix or not os.path.exists(os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED')))"; then \
		echo "$(PYTHON) is externally managed (PEP 668): pip install --break-system-packages (make PYTHON=<venv>/bin/python to use a virtualenv)"; \
		flag=--break-system-packages; \
	fi; \
	$(PYTHON) -m pip install -q --disable-pip-version-check $$flag -e '.[dev]'

stack: install ## Bring the local stack up (Postgres, Kafka, Connect + Debezium, schema registry)
	$(CDC) local up --with registry

# Two workers share the running stack (the tests wait on Kafka and Connect about half the time);
# the few tests marked exclusive (they stop a shared part, or start a whole stack) run after,
# alone. A stack must be up before `pytest -n`: its workers must not each bring one up.
TEST_WORKERS ?= 2

# Each router, relay or CLI process a test starts imports the package: where
# PYTHONDONTWRITEBYTECODE is set (this CI machine sets it) each compiled it anew, about 0.2 s of
# CPU apiece over a thousand processes; bytecode written once beforehand is read by them all.
bytecode:
	@$(PYTHON) -m compileall -q cdc_router >/dev/null

test: stack bytecode ## Unit and integration tests on the real local stack (TEST_WORKERS=2 at once, then the exclusive ones)
	$(PYTHON) -m pytest tests -n $(TEST_WORKERS) --dist loadgroup -m "not exclusive"
	$(PYTHON) -m pytest tests -m exclusive

test-unit: ## Unit tests only (no stack)
	$(PYTHON) -m pytest tests/unit

lint: ## ruff
	$(PYTHON) -m ruff check cdc_router tests

typecheck: ## mypy (strict)
	$(PYTHON) -m mypy

demo: stack ## The whole pipeline on the local stack, with defaults
	CDC_ROUTER_DB_PASSWORD=$${CDC_ROUTER_DB_PASSWORD:-debezium} $(CDC) outbox init --replication-role debezium
	$(CDC) connectors apply -f connectors/outbox-connector.json --yes
	$(CDC) connectors wait outbox-connector --state RUNNING --timeout 120
	$(CDC) topics apply -c cdc_router/examples/router.yaml --yes
	$(CDC) demo -c cdc_router/examples/router.yaml

BENCH_ARGS ?= --rows 100000 --latency-seconds 20

bench: stack ## Every outbox path side by side (router, SMT, pollers), router memory: table, JSON, PNG (README)
	$(PYTHON) -m tests.bench.side_by_side $(BENCH_ARGS) --json bench-results.json --png bench-results.png

bench-router: stack ## Router alone (100k events) per delivery mode, beside a plain loop
	$(PYTHON) -m tests.bench.router_throughput --events 100000

bench-scale: stack ## One router instance against two, on a raw topic of two partitions
	$(PYTHON) -m tests.bench.scale_out --events 100000

bench-memory: stack ## Router RSS with 1M ids in the dedup window, against none (issue 14's goal)
	$(PYTHON) -m tests.bench.replay_memory --ids 1000000 --json bench-memory.json

# The chaos campaign kills Kafka, Connect and Postgres: it runs on a stack of its own
# (CHAOS_HOME, other ports), never on the one `make stack` starts for everybody. Its ports are
# below Linux's ephemeral range (32768-60999): a client reconnecting to a killed broker may be
# given the broker's own port there as its local port, and hold it (QA 31-e).
CHAOS_HOME ?= $(CURDIR)/.chaos-stack
CHAOS_STACK := --home $(CHAOS_HOME) --postgres-port 17432 --kafka-port 17092 --kafka-controller-port 17093 --connect-port 17083
CHAOS_ENV := CDC_ROUTER_HOME=$(CHAOS_HOME) CDC_ROUTER_BOOTSTRAP_SERVERS=127.0.0.1:17092 CDC_ROUTER_CONNECT_URL=http://127.0.0.1:17083 CDC_ROUTER_PG_DSN=postgresql://postgres:postgres@127.0.0.1:17432/postgres
CHAOS_SEED ?= 15

chaos: install bytecode ## Chaos campaign: 100k events, every fault kind, on its own stack (README)
	$(CDC) local up $(CHAOS_STACK)
	$(CHAOS_ENV) $(PYTHON) -m tests.chaos --profile full --events 100000 --seed $(CHAOS_SEED) --report chaos-report.json

chaos-short: install bytecode ## Chaos campaign, short: 10k events, one fault of each kind (CI)
	$(CDC) local up $(CHAOS_STACK)
	$(CHAOS_ENV) $(PYTHON) -m tests.chaos --profile short --events 10000 --seed $(CHAOS_SEED) --report chaos-report-short.json

bench-avro: ## Avro validation and encoding on their own (events/s; no stack needed)
	$(PYTHON) -m tests.bench.avro_encoding --events 100000

clean: ## Stop the local stack and remove its data
	-$(CDC) local down --purge

# Docker (docker/README.md). Compose v2 when the docker CLI has it, else Debian's docker-compose v1.
COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)
COMPOSE_FILE := docker/docker-compose.yml
COMPOSE_PROFILES_ALL := redis registry monitoring nats
PROFILES ?=

up: docker/.env ## Docker: build and start the pipeline; PROFILES="redis registry monitoring nats" adds those
	$(COMPOSE) -f $(COMPOSE_FILE) --env-file docker/.env $(foreach p,$(PROFILES),--profile $(p)) up -d --build

down: ## Docker: stop and remove the containers (the data volumes stay)
	$(COMPOSE) -f $(COMPOSE_FILE) --env-file $(firstword $(wildcard docker/.env) docker/.env.example) $(foreach p,$(COMPOSE_PROFILES_ALL),--profile $(p)) down

compose-config: ## Docker: validate docker/docker-compose.yml (no engine needed)
	$(COMPOSE) -f $(COMPOSE_FILE) --env-file docker/.env.example $(foreach p,$(COMPOSE_PROFILES_ALL),--profile $(p)) config -q

# The first `make up` writes docker/.env (git-ignored, mode 600) from the example, with a new
# random value for each change-me password.
docker/.env:
	@umask 077 && $(PYTHON) -c 'import re, secrets, sys; sys.stdout.write(re.sub(r"=change-me$$", lambda m: "=" + secrets.token_hex(16), open("docker/.env.example").read(), flags=re.M))' > $@.tmp && mv $@.tmp $@
	@echo "wrote docker/.env with random passwords"
