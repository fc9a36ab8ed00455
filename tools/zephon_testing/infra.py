"""Helpers for tests that need real infrastructure: a Prometheus server, Docker images, ports.

Not tests themselves. Everything started here binds to loopback, is stopped by its handle
(``with`` or ``.stop()``), and is stopped again at interpreter exit as a safety net.

* ``start_prometheus(tmp_path, targets)`` runs Debian's ``/usr/bin/prometheus`` scraping the
  given ``host:port`` targets; ``.query(expr)`` and ``.wait_for(expr, predicate)`` read its
  HTTP API.
* ``build_image(tag)`` builds ``docker/Dockerfile`` once per session on the base image that
  ``tools/install-system-deps.sh`` prepared; ``run_container(image, ...)`` runs it detached.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = "/usr/bin/prometheus"
INSTALL_SCRIPT = REPO / "tools" / "install-system-deps.sh"
BASE_IMAGE_FILE = REPO / ".ci" / "base-image"
DEFAULT_BASE_IMAGE = "python:3.11-slim"
CONTAINER_LABEL = "zephon-test=1"  # on test images and containers

_live: set[PrometheusHandle | ContainerHandle] = set()
_built: dict[str, str] = {}
_deps_done: set[bool] = set()  # the `docker` arguments already run


def _stop_all() -> None:
    for handle in list(_live):
        handle.stop()


atexit.register(_stop_all)


# --- ports ----------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(host: str, port: int, timeout: float = 10.0) -> None:
    """Block until ``host:port`` accepts a TCP connection; TimeoutError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError as err:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{host}:{port} refused connections for {timeout}s") from err
            time.sleep(0.05)


def _http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return reply.read()


# --- system dependencies ------------------------------------------------------------------


def ensure_system_deps(*, docker: bool = True) -> None:
    """Run ``tools/install-system-deps.sh`` once per session (quick when all is installed).

    ``docker=False`` installs Prometheus only (seconds, where Docker's first setup takes
    minutes). Raises RuntimeError with the script's output when it fails. Needs root; as
    another user it does nothing and the tests rely on what the machine already has.
    """
    if os.geteuid() != 0 or docker in _deps_done or True in _deps_done:
        return
    env = dict(os.environ)
    if not docker:
        env["ZEPHON_NO_DOCKER"] = "1"
    proc = subprocess.run(
        ["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=1800, env=env
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{INSTALL_SCRIPT} failed:\n{proc.stdout}{proc.stderr}")
    _deps_done.add(docker)


# --- Prometheus -----------------------------------------------------------------------------


class PrometheusHandle:
    """A running Prometheus subprocess and its HTTP API at ``url``."""

    def __init__(self, process: subprocess.Popen, url: str, workdir: Path) -> None:
        self.process = process
        self.url = url
        self.workdir = workdir

    def query(self, expr: str) -> list[dict]:
        """Instant query: the ``data.result`` list (``{"metric": {...}, "value": [t, "v"]}``)."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        reply = json.loads(_http_get(url))
        if reply.get("status") != "success":
            raise RuntimeError(f"prometheus query {expr!r} failed: {reply}")
        return reply["data"]["result"]

    def wait_for(
        self, expr: str, predicate: Callable[[list[dict]], bool], timeout: float = 30.0
    ) -> list[dict]:
        """Poll ``query(expr)`` until ``predicate(result)`` holds (scrapes take a moment)."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if predicate(result):
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"prometheus: {expr!r} did not satisfy the predicate in {timeout}s; "
                    f"last result {result}; targets {self.targets()}"
                )
            time.sleep(0.25)

    def targets(self) -> list[dict]:
        """The active scrape targets with their health and last error (for diagnostics)."""
        reply = json.loads(_http_get(f"{self.url}/api/v1/targets"))
        return [
            {k: t.get(k) for k in ("scrapeUrl", "health", "lastError")}
            for t in reply["data"]["activeTargets"]
        ]

    def log(self) -> str:
        """What Prometheus printed so far."""
        return (self.workdir / "prometheus.log").read_text(errors="replace")

    def stop(self) -> None:
        """Terminate the process (kill after 10 s) and wait for it."""
        _live.discard(self)
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> PrometheusHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def prometheus_available() -> bool:
    """True when Debian's Prometheus binary is installed (after install-system-deps.sh)."""
    if not os.access(PROMETHEUS, os.X_OK):
        ensure_system_deps(docker=False)
    return os.access(PROMETHEUS, os.X_OK)


def start_prometheus(
    tmp_path: Path,
    targets: Sequence[str],
    scrape_interval: str = "1s",
    *,
    job: str = "zephon",
    timeout: float = 30.0,
) -> PrometheusHandle:
    """Start Prometheus scraping ``targets`` (``host:port``) under job ``job``; wait for ready."""
    workdir = Path(tmp_path) / f"prometheus-{free_port()}"
    workdir.mkdir(parents=True)
    config = workdir / "prometheus.yml"
    # JSON is YAML: no YAML writer needed.
    config.write_text(
        json.dumps(
            {
                "global": {"scrape_interval": scrape_interval, "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": job,
                        "scrape_interval": scrape_interval,
                        "scrape_timeout": scrape_interval,
                        "static_configs": [{"targets": list(targets)}],
                    }
                ],
            },
            indent=2,
        )
    )
    last_error = ""
    for _ in range(3):  # the port can be taken between free_port() and the bind
        port = free_port()
        with open(workdir / "prometheus.log", "wb") as log:
            process = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        handle = PrometheusHandle(process, f"http://127.0.0.1:{port}", workdir)
        _live.add(handle)
        deadline = time.monotonic() + timeout
        while process.poll() is None and time.monotonic() < deadline:
            try:
                _http_get(f"{handle.url}/-/ready", timeout=1.0)
                return handle
            except OSError:
                time.sleep(0.1)
        last_error = handle.log()
        handle.stop()
    raise RuntimeError(f"prometheus did not become ready:\n{last_error}")


# --- Docker ---------------------------------------------------------------------------------


def _docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
    return proc


def _daemon_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return _docker("info", timeout=20, check=False).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def docker_available() -> bool:
    """True when a Docker daemon answers, after install-system-deps.sh set it up if it could.

    A failing install script raises (so CI fails loudly); a machine where the script has no
    way to provide Docker (no shared/tools/docker-env.sh, not root, ZEPHON_NO_DOCKER=1) just
    answers False, or True when the machine has its own daemon.
    """
    if os.environ.get("ZEPHON_NO_DOCKER") == "1":
        return False
    ensure_system_deps()  # also records the base image; well under a second once installed
    return _daemon_answers()


def base_image() -> str:
    """The ``BASE_IMAGE`` build argument: what install-system-deps.sh recorded, or the default."""
    if BASE_IMAGE_FILE.exists():
        return BASE_IMAGE_FILE.read_text().strip() or DEFAULT_BASE_IMAGE
    return DEFAULT_BASE_IMAGE


def build_image(tag: str = "zephon:test", timeout: float = 1800) -> str:
    """Build ``docker/Dockerfile`` from the repo as ``tag``, once per session; returns ``tag``."""
    if tag in _built:
        return _built[tag]
    if not docker_available():
        raise RuntimeError("no Docker daemon (run tools/install-system-deps.sh as root)")
    base = base_image()
    _docker(
        "build",
        "--build-arg",
        f"BASE_IMAGE={base}",
        "-f",
        str(REPO / "docker" / "Dockerfile"),
        "-t",
        tag,
        "--label",
        CONTAINER_LABEL,
        str(REPO),
        timeout=timeout,
    )
    # Earlier builds of the tag left untagged images behind: drop those, not the build cache.
    _docker("image", "prune", "-f", "--filter", f"label={CONTAINER_LABEL}", check=False)
    _built[tag] = tag
    return tag


class ContainerHandle:
    """A detached container; ``ports`` maps container ports to their 127.0.0.1 host ports."""

    def __init__(self, container_id: str, ports: dict[int, int]) -> None:
        self.id = container_id
        self.ports = ports

    def logs(self) -> str:
        """Its stdout and stderr so far."""
        proc = _docker("logs", self.id, check=False)
        return proc.stdout + proc.stderr

    def wait(self, timeout: float = 60) -> int:
        """Wait for the main process to exit; its exit code."""
        return int(_docker("wait", self.id, timeout=timeout).stdout.strip())

    def exec(self, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """``docker exec`` a command in the running container (not checked)."""
        return _docker("exec", self.id, *cmd, timeout=timeout, check=False)

    def health(self) -> str:
        """Docker's HEALTHCHECK status: starting, healthy, unhealthy (or "" without one)."""
        fmt = "{{if .State.Health}}{{.State.Health.Status}}{{end}}"
        return _docker("inspect", "-f", fmt, self.id).stdout.strip()

    def stop(self) -> None:
        """Remove the container (and its anonymous volumes) whatever its state."""
        _live.discard(self)
        _docker("rm", "-f", "-v", self.id, check=False)

    def __enter__(self) -> ContainerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_container(
    image: str,
    *args: str,
    ports: Iterable[int] = (),
    entrypoint: str | None = None,
    env: dict[str, str] | None = None,
    user: str | None = None,
) -> ContainerHandle:
    """``docker run -d`` the image with ``args``; each of ``ports`` is published on 127.0.0.1.

    Host ports are picked by Docker (no races); read them from ``handle.ports``.
    """
    cmd = ["run", "-d", "--label", CONTAINER_LABEL]
    for port in ports:
        cmd += ["-p", f"127.0.0.1::{port}"]
    if entrypoint is not None:
        cmd += ["--entrypoint", entrypoint]
    for key, value in (env or {}).items():
        cmd += ["-e", f"{key}={value}"]
    if user is not None:
        cmd += ["--user", user]
    container_id = _docker(*cmd, image, *args).stdout.strip()
    handle = ContainerHandle(container_id, {})
    _live.add(handle)
    try:
        for port in ports:
            # "127.0.0.1:49153" (one line per address family; ours is IPv4 only).
            mapped = _docker("port", container_id, f"{port}/tcp").stdout.split()[0]
            handle.ports[port] = int(mapped.rsplit(":", 1)[1])
    except Exception:
        handle.stop()
        raise
    return handle
