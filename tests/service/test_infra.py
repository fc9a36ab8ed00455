"""The test infrastructure itself: a real Prometheus scrape, and the Docker image.

The Prometheus test proves the harness in ``infra.py`` against a plain ``prometheus_client``
exporter, independently of the Zephon server. The Docker tests build ``docker/Dockerfile``
(minutes the first time on a machine, seconds when cached) and skip where no Docker daemon can
be had; in CI ``tools/install-system-deps.sh`` provides one.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from prometheus_client import CollectorRegistry, Counter, start_http_server

from zephon_testing.infra import (
    REPO,
    build_image,
    docker_available,
    free_port,
    prometheus_available,
    run_container,
    start_prometheus,
    wait_for_port,
)

pytestmark = pytest.mark.service

IMAGE = "zephon:test"


def _value(result: list[dict]) -> float | None:
    return float(result[0]["value"][1]) if result else None


@pytest.mark.timeout(120)
def test_prometheus_scrapes_an_exporter(tmp_path):
    if not prometheus_available():
        pytest.skip("no /usr/bin/prometheus (run tools/install-system-deps.sh as root)")
    registry = CollectorRegistry()
    counter = Counter(
        "infra_probe_events", "Events counted by the harness test.", ["kind"], registry=registry
    )
    counter.labels(kind="probe").inc(7)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        wait_for_port("127.0.0.1", port)
        with start_prometheus(tmp_path, [f"127.0.0.1:{port}"], job="probe") as prom:
            up = prom.wait_for('up{job="probe"}', lambda r: _value(r) == 1.0)
            assert up[0]["metric"]["instance"] == f"127.0.0.1:{port}"
            result = prom.wait_for(
                'infra_probe_events_total{job="probe"}', lambda r: _value(r) == 7.0
            )
            assert result[0]["metric"]["kind"] == "probe"
            counter.labels(kind="probe").inc(5)
            prom.wait_for('infra_probe_events_total{kind="probe"}', lambda r: _value(r) == 12.0)
        assert prom.process.poll() is not None  # stopped by the with block
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture(scope="module")
def image():
    if not docker_available():
        pytest.skip("no Docker daemon (run tools/install-system-deps.sh as root)")
    return build_image(IMAGE)


@pytest.mark.timeout(1800)  # the first build on a machine installs the server's dependencies
def test_image_runs_the_cli_as_non_root(image):
    with run_container(image, "--help", entrypoint="zephon") as help_run:
        assert help_run.wait() == 0, help_run.logs()
        assert "usage" in help_run.logs().lower()
    with run_container(image, "-u", entrypoint="id") as id_run:
        assert id_run.wait() == 0, id_run.logs()
        assert id_run.logs().strip() == "10001"
    # The health probe imports grpc_health and reports a missing server as unhealthy.
    with run_container(image, "/app/docker/healthcheck.py", entrypoint="python") as probe:
        assert probe.wait() == 1
        assert "unhealthy" in probe.logs()


@pytest.mark.timeout(1800)
def test_container_serves_health_and_metrics(image, tmp_path):
    """The image's default command serves: health probe, demo trainer, Prometheus, HEALTHCHECK."""
    with run_container(image, ports=(50051, 9400)) as server:
        deadline = time.monotonic() + 120
        while True:
            probe = server.exec("python", "/app/docker/healthcheck.py", timeout=30)
            if probe.returncode == 0:
                break
            assert time.monotonic() < deadline, f"{probe.stderr}\n{server.logs()}"
            time.sleep(0.5)
        address = f"127.0.0.1:{server.ports[50051]}"
        demo = [sys.executable, str(REPO / "examples" / "demo_trainer.py"), "--address", address]
        trainer = subprocess.run(
            [*demo, "--steps", "20", "--checkpoint-every", "10"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert trainer.returncode == 0, trainer.stderr
        assert "done:" in trainer.stderr
        # The image preloads mimalloc (ENV LD_PRELOAD): the server names it, never re-executes.
        assert "memory allocator: mimalloc" in server.logs()
        assert "preloaded already" in server.logs() and "re-executed" not in server.logs()
        with start_prometheus(tmp_path, [f"127.0.0.1:{server.ports[9400]}"]) as prom:
            prom.wait_for('up{job="zephon"}', lambda r: _value(r) == 1.0)
            prom.wait_for("sum(zephon_batches_sent_total)", lambda r: (_value(r) or 0) >= 20)
        while server.health() != "healthy":  # Docker's own HEALTHCHECK (every 10 s)
            assert time.monotonic() < deadline + 60, server.health()
            time.sleep(1)
