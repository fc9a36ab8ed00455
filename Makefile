# The one command surface: run, test, lint, proto, bench, docker.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
STAMP := .install.stamp

.PHONY: install run test lint typecheck pytest bench proto docker clean

$(STAMP): pyproject.toml
	$(PIP) install --quiet --disable-pip-version-check -e '.[server,dev]'
	@touch $(STAMP)

install: $(STAMP)

# Serves the embedded default pipeline (until the gRPC server lands: runs it in-process).
run: install
	$(PYTHON) -m zephon_server.cli run-default

lint: install
	$(PYTHON) -m ruff check server client tests bench
	$(PYTHON) -m ruff format --check server client tests bench
	$(PYTHON) -m mypy server/zephon_server client/zephon_client

pytest: install
	$(PYTHON) -m pytest -q -p no:cacheprovider

test: lint pytest

# Regenerates the checked-in protobuf/gRPC code (client/zephon_proto) from proto/ with the
# pinned grpcio-tools: tools/gen_proto.py runs `$(PYTHON) -m grpc_tools.protoc -Iproto ...`.
proto: install
	$(PYTHON) tools/gen_proto.py

bench: install
	$(PYTHON) -m bench.tokenize_bench

clean:
	rm -rf $(STAMP) build *.egg-info .mypy_cache .ruff_cache
