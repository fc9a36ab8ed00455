"""The documentation is tested: examples run, the config reference matches the code, metrics are all
documented, links resolve: the tests that need a subprocess, worker processes, a socket or the
wall clock.

The hermetic tests of the same topic are in ``tests/unit/test_docs.py``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.unit.test_docs import (
    DOCS,
    PAGES,
    Block,
    Example,
    matches,
    page_examples,
)

DEFAULT_TIMEOUT = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def missing_requirements(block: Block) -> list[str]:
    names = [n for n in block.attrs.get("requires", "").split(",") if n]
    return [n for n in names if shutil.which(n) is None and importlib.util.find_spec(n) is None]


class PageRun:
    """The temporary directory, environment and servers of one page's examples."""

    def __init__(self, workdir: Path, corpus_root: Path) -> None:
        self.workdir = workdir
        bindir = workdir / ".bin"
        bindir.mkdir()
        # A script, not a symlink: a symlink to a virtual environment's python outside the
        # environment's bin/ would not find its pyvenv.cfg and lose the environment's packages.
        python = bindir / "python"
        python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        python.chmod(0o755)
        zephon = bindir / "zephon"
        zephon.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m zephon_server.cli "$@"\n')
        zephon.chmod(0o755)
        (workdir / "zephon-data").symlink_to(corpus_root, target_is_directory=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZEPHON_")}
        env.update(
            PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}",
            ZEPHON_DATA_DIR=str(workdir / "zephon-data"),
            GRPC_PORT=str(free_port()),
            METRICS_PORT=str(free_port()),
            PYTHONUNBUFFERED="1",
        )
        self.env = env
        self.servers: dict[str, tuple[subprocess.Popen[bytes], str, Path]] = {}

    def server(self, config: str) -> str:
        """The address of the page's server for ``config`` ("" = default), started once."""
        if config in self.servers:
            return self.servers[config][1]
        n = len(self.servers)
        port_file = self.workdir / f".server-{n}.port"
        log_path = self.workdir / f".server-{n}.log"
        args = ["zephon", "serve", "--port", "0", "--port-file", str(port_file)]
        args += ["--state-dir", "server-state", "--log-interval", "0"]
        if config:
            args += ["--config", config]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                args, cwd=self.workdir, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"zephon serve did not start:\n{log_path.read_text()}")
            time.sleep(0.05)
        address = f"127.0.0.1:{int(port_file.read_text())}"
        self.servers[config] = (proc, address, log_path)
        return address

    def close(self) -> None:
        """SIGTERM every server; each must exit 0 (a clean drain)."""
        problems = []
        for proc, _, log_path in self.servers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait(10)
            if code != 0:
                problems.append(f"server exit {code}:\n{log_path.read_text()[-3000:]}")
        assert not problems, "\n".join(problems)

    def run(self, example: Example) -> None:
        block = example.block
        attrs = block.attrs
        if "file" in attrs:
            target = self.workdir / attrs["file"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code)
            return
        script = self.workdir / f".example-{block.line}.{'py' if block.lang == 'python' else 'sh'}"
        script.write_text(block.code)
        if block.lang == "python":
            cmd = ["python", script.name]
        elif block.lang in ("bash", "sh", "console", "shell"):
            cmd = ["bash", "-euo", "pipefail", script.name]
        else:
            raise AssertionError(f"{block.where}: cannot run a '{block.lang}' example")
        env = dict(self.env)
        if "server" in attrs:
            env["ZEPHON_ADDRESS"] = self.server(attrs["server"])
        timeout = float(attrs.get("timeout", DEFAULT_TIMEOUT))
        want_exit = int(attrs.get("exit", "0"))
        cmd[0] = shutil.which(cmd[0], path=env["PATH"]) or cmd[0]
        proc = subprocess.Popen(
            cmd,
            cwd=self.workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: background servers die with it
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            out, err = proc.communicate()
            raise AssertionError(
                f"{block.where}: timed out after {timeout:g} s\n"
                f"--- stdout\n{out.decode()[-3000:]}\n--- stderr\n{err.decode()[-3000:]}"
            ) from None
        finally:
            _kill_group(proc.pid)
        stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
        report = (
            f"\n--- code\n{block.code}--- stdout\n{stdout[-4000:]}\n--- stderr\n{stderr[-4000:]}"
        )
        assert proc.returncode == want_exit, (
            f"{block.where}: exit status {proc.returncode}, expected {want_exit}{report}"
        )
        missing = matches(example.expected, stdout + "\n" + stderr)
        assert missing is None, f"{block.where}: output line not found: {missing!r}{report}"


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _needs_server(examples: list[Example]) -> bool:
    return any(
        "server" in e.block.attrs or "zephon serve" in e.block.code or "DataClient" in e.block.code
        for e in examples
    )


def _page_params() -> list:
    params = []
    for page in PAGES:
        examples = page_examples(page)
        if examples:
            marks = [pytest.mark.service] if _needs_server(examples) else []
            params.append(pytest.param(page, id=page.name, marks=marks))
    return params


@pytest.fixture(scope="session")
def sample_corpus(tmp_path_factory) -> Path:
    """The sample corpus exactly as ``zephon`` generates it on first start."""
    from zephon_server.defaults import default_pipeline_specs

    root = tmp_path_factory.mktemp("zephon-data")
    default_pipeline_specs(root)
    return root


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", _page_params())
def test_page_examples(page: Path, tmp_path: Path, sample_corpus: Path) -> None:
    run = PageRun(tmp_path, sample_corpus)
    skipped = []
    try:
        for example in page_examples(page):
            missing = missing_requirements(example.block)
            if missing:
                skipped.append(f"{example.block.where} (needs {', '.join(missing)})")
                continue
            run.run(example)
    finally:
        run.close()
    if skipped:
        print("skipped examples:", *skipped, sep="\n  ")


def exposed_metric_names(corpus_specs) -> dict[str, str]:
    """Name -> type of every metric family a serving server exposes (``_created`` aside)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from tests.support.builders import make_pipeline
    from zephon_server.delivery.hub import LaneHub
    from zephon_server.engine.execution import ExecutionConfig
    from zephon_server.service.metrics import ServiceMetrics

    pipe = make_pipeline(corpus_specs, lanes=2, ops=[("pack_flat", {"max_length": 64})])
    pipe.add("batch", microbatch_size=2)
    index_dir = tempfile.mkdtemp(prefix="zephon-docs-index-")  # the index families too
    hub = LaneHub(pipe, ExecutionConfig(runner="threads", workers=1, index_dir=index_dir))
    hub.start()
    try:
        deadline = time.monotonic() + 60
        while not any(st["produced"] for st in hub.stats()["lanes"].values()):
            assert time.monotonic() < deadline, "the pipeline produced nothing"
            time.sleep(0.05)
        registry = CollectorRegistry()
        ServiceMetrics(registry, hub)
        text = generate_latest(registry).decode()
    finally:
        hub.stop()
        shutil.rmtree(index_dir, ignore_errors=True)
    found = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.M))
    return {name: kind for name, kind in found.items() if not name.endswith("_created")}


@pytest.mark.service
def test_every_metric_is_documented(corpus_specs) -> None:
    names = exposed_metric_names(corpus_specs)
    assert len(names) >= 15
    page = (DOCS / "metrics.md").read_text()
    missing = [name for name in names if f"`{name}`" not in page]
    assert not missing, f"docs/metrics.md does not document {missing}"
    documented = set(re.findall(r"`(zephon_[a-z_]+)", page))
    suffixes = ("_bucket", "_sum", "_count", "_created")
    unknown = [
        n
        for n in documented
        if n not in names and not any(n.endswith(s) and n[: -len(s)] in names for s in suffixes)
    ]
    assert not unknown, f"docs/metrics.md documents metrics the server does not have: {unknown}"
