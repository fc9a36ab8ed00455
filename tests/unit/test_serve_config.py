"""The server's frozen configuration (service/config.py) and how the command line builds it
(serve_flags.py): bad values name the flag, equivalent flags and environment give equal
configs, and the service is handed the objects, never an argparse namespace."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from zephon_server.cli import build_parser
from zephon_server.engine.errors import ConfigError, ZephonError
from zephon_server.runtime import RuntimeConfig
from zephon_server.serve_flags import parse_lanes, serve_config
from zephon_server.service import server as server_module
from zephon_server.service.config import (
    DeliveryConfig,
    ListenConfig,
    ServeConfig,
    StateConfig,
    TlsFiles,
    check_number,
)


def config(*flags: str, env: dict[str, str] | None = None) -> ServeConfig:
    """The ServeConfig ``zephon serve FLAGS`` builds in environment ``env``."""
    return serve_config(build_parser().parse_args(["serve", *flags]), env or {})


def test_the_defaults_are_the_flags_defaults():
    assert config() == ServeConfig()
    assert config().runtime == RuntimeConfig()
    assert config().delivery.linger == DeliveryConfig().linger == 0.015


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: DeliveryConfig(max_replays=1025), "--max-replays must be a whole number between"),
        (lambda: DeliveryConfig(max_replays=True), "--max-replays .* got True"),
        (lambda: DeliveryConfig(linger=2.0), "--linger-ms must be between 0 and 1000"),
        (lambda: DeliveryConfig(ring_mib=-1), "--shm-ring-mib must be a whole number"),
        (lambda: DeliveryConfig(max_ahead=0), "--max-ahead must be an integer >= 1, got 0"),
        (lambda: DeliveryConfig(max_streams=0), "--max-streams must be a whole number"),
        (lambda: DeliveryConfig(lanes=(0, -1)), "--lanes must be an integer >= 0"),
        (lambda: DeliveryConfig(lanes=()), "--lanes must name at least one lane"),
        (lambda: ListenConfig(port=70000), "--port must be a whole number between 0 and 65535"),
        (lambda: ListenConfig(host=""), "--host must be an address"),
        (lambda: ListenConfig(auth_token=""), "--auth-token must not be empty"),
        (lambda: TlsFiles("cert.pem", ""), "TLS needs both --tls-cert and --tls-key"),
        (lambda: StateConfig(keep_checkpoints=-1), "--keep-checkpoints must be an integer >= 0"),
        (lambda: StateConfig(keep_checkpoints=2), "--keep-checkpoints needs --state-dir"),
        (lambda: StateConfig(resume="latest"), "--resume latest needs --state-dir"),
        (lambda: StateConfig(replay_cache_epochs=0), "--replay-cache-epochs must be an integer"),
        (lambda: StateConfig(replay_cache_max_bytes=0), "--replay-cache-max-bytes must be more"),
        (lambda: ServeConfig(log_interval=-1), "--log-interval must be a number >= 0"),
        (lambda: ServeConfig(drain_grace="10"), "--drain-grace must be a number >= 0, got '10'"),
        (lambda: ServeConfig(delivery=None), "ServeConfig.delivery: expected a DeliveryConfig"),
        (lambda: RuntimeConfig(gc="off"), "unknown garbage-collector policy 'off' .--gc"),
    ],
)
def test_a_bad_value_names_its_flag(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-replays", "2000"], "--max-replays must be a whole number between 0 and 1024"),
        (["--linger-ms", "-1"], "--linger-ms must be between 0 and 1000"),
        (["--shm-ring-mib", "5000"], "--shm-ring-mib must be a whole number between 0 and 4096"),
        (["--max-ahead", "0"], "--max-ahead must be an integer >= 1"),
        (["--tls-client-ca", "ca.pem"], "--tls-client-ca needs --tls-cert and --tls-key"),
        (["--tls-cert", "c.pem"], "TLS needs both --tls-cert and --tls-key"),
        (["--replay-cache-max-bytes", "lots"], "--replay-cache-max-bytes must be a number"),
        (["--lanes", "0,x"], "--lanes: expected a list like 0,1,4-7"),
        (["--metrics-port", "70000"], "--metrics-port must be a whole number between 0 and"),
        (["--resume", "latest-or-fresh"], "--resume latest-or-fresh needs --state-dir"),
    ],
)
def test_the_command_line_reports_the_flag(flags, message):
    with pytest.raises(ZephonError, match=message):
        config(*flags)


def test_equivalent_flags_and_environment_build_the_same_config(tmp_path):
    by_env = config(
        env={
            "ZEPHON_AUTH_TOKEN": "grpc-secret",
            "ZEPHON_METRICS_TOKEN": "scrape",
            "ZEPHON_GC": "default",
            "ZEPHON_ALLOCATOR": "system",
        }
    )
    by_flags = config(
        "--auth-token=grpc-secret",
        "--gc",
        "default",
        "--allocator",
        "system",
    )
    assert by_env == by_flags
    assert by_env.listen.auth_token == "grpc-secret" and "grpc-secret" not in repr(by_env)
    assert by_env.runtime == RuntimeConfig(allocator="system", gc="default")
    # A flag wins over its variable.
    env = {"ZEPHON_AUTH_TOKEN": "env", "ZEPHON_GC": "default"}
    assert config("--auth-token", "flag", "--gc", "tuned", env=env).listen.auth_token == "flag"
    assert config("--gc", "tuned", env=env).runtime.gc == "tuned"
    # Other spellings of the same values.
    assert config("--lanes", "0-3", "--linger-ms", "5") == config(
        "--lanes=0,1,2,3", "--linger-ms=5.0"
    )
    assert config("--lanes", "0-3").delivery.lanes == (0, 1, 2, 3)
    assert config("--linger-ms", "0").delivery.linger == 0.0
    sized = config("--state-dir", str(tmp_path), "--replay-cache-max-bytes", "2G").state
    assert sized.replay_cache_max_bytes == 2 << 30
    assert sized.replay_cache == str(tmp_path / "replay-cache")
    assert config("--state-dir", str(tmp_path), "--replay-cache", "off").state.replay_cache is None
    # The environment's arena limit and tokenizer switch reach the runtime config.
    tuned = config(env={"MALLOC_ARENA_MAX": "4", "TOKENIZERS_PARALLELISM": "true"}).runtime
    assert tuned.malloc_arenas is None and tuned.tokenizers_parallelism


def test_metrics_and_state_come_from_their_flags(tmp_path):
    key = tmp_path / "key"
    key.write_text("a checkpoint key of 32 characters!")
    built = config(
        "--metrics-port",
        "0",
        "--state-dir",
        str(tmp_path),
        "--keep-checkpoints",
        "3",
        "--checkpoint-key-file",
        str(key),
        "--resume",
        "latest",
        env={"ZEPHON_METRICS_TOKEN": "scrape"},
    )
    assert built.metrics is not None and built.metrics.token == "scrape"
    assert built.state.keep_checkpoints == 3 and built.state.resume == "latest"
    assert built.state.checkpoint_key is not None and "checkpoint key" not in repr(built)


def test_configs_are_frozen():
    built = config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.delivery.max_ahead = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.runtime.gc = "default"  # type: ignore[misc]


def test_the_service_takes_the_config_not_a_namespace():
    for fn in (server_module.Server.__init__, server_module.serve):
        params = inspect.signature(fn).parameters
        assert params["config"].annotation in ("ServeConfig", ServeConfig), fn
    source = inspect.getsource(server_module)
    assert "argparse" not in source and "getattr(args" not in source
    assert "os.environ" not in source


def test_check_number_is_the_one_range_check():
    check_number("--x", 3, 0, 10)
    check_number("--x", 2.5, 0, 10, whole=False)
    for bad in (11, -1, 2.5, True, "3", None):
        with pytest.raises(ConfigError, match=r"^--x must be a whole number between 0 and 10"):
            check_number("--x", bad, 0, 10)
    with pytest.raises(ConfigError, match=r"--y must be a number >= 1 \(seconds\), got 0.5"):
        check_number("--y", 0.5, 1, whole=False, hint="seconds")


def test_parse_lanes():
    assert parse_lanes("0,1,4-7") == [0, 1, 4, 5, 6, 7]
    assert parse_lanes(None) is None and parse_lanes("") is None
    with pytest.raises(ZephonError, match=r"--lanes: the range 3-1 runs backwards; write 1-3"):
        parse_lanes("0,3-1")
    with pytest.raises(ZephonError, match=r"--lanes: expected a list like 0,1,4-7"):
        parse_lanes("-3")
