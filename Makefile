# Entry points. `make demo` and `make test` install what they need themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Parallel test workers: one local control plane per worker.
WORKERS ?= 2

.PHONY: install demo test test-unit test-integration test-go lint generate check-generated release bench down clean

# The project and its standalone Python SDK (clients/python, used by the CLI), both editable.
$(STAMP): pyproject.toml clients/python/pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e 'clients/python[grpc,tracing,socks]' -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/agent-sandbox demo

test: install
	bash hack/test.sh

test-unit: install
	$(BIN)/pytest -m unit -q

test-integration: install
	$(BIN)/pytest -m 'integration or e2e' -n $(WORKERS) -q

# The Go SDK (clients/go): stub drift check, go vet, staticcheck, go test -race (unit + e2e).
test-go: install
	bash clients/go/hack/test.sh

lint: install
	$(BIN)/ruff check src tests benchmarks clients/python
	$(BIN)/ruff format --check src tests benchmarks clients/python
	$(BIN)/mypy

generate: install
	$(BIN)/agent-sandbox generate

check-generated: install
	$(BIN)/agent-sandbox generate --check

# Release assets into release_assets/ (docs/install.md): make release TAG=v0.1.0 [REGISTRY=...]
REGISTRY ?= registry.k8s.io/agent-sandbox
release: install
	@test -n "$(TAG)" || { echo "usage: make release TAG=vX.Y.Z [REGISTRY=...]"; exit 2; }
	$(BIN)/agent-sandbox release --tag $(TAG) --registry $(REGISTRY)

# Benchmarks (not part of `make test`): the `bench` extra adds matplotlib (plots) and py-spy (profiles).
bench: install
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python -m benchmarks all

down: install
	$(BIN)/agent-sandbox dev down --all

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
