"""YAML configs: the binding keys load; bad configs fail at load naming the problem."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from zephon_server.engine.config import load_config, parse_config
from zephon_server.engine.errors import ConfigError


def write(tmp_path, text: str):
    path = tmp_path / "pipeline.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def base_config(corpus_dir) -> dict:
    return {
        "seed": 1234,
        "lanes": 8,
        "chunk_size": 256,
        "datasets": [
            {"name": "web", "path": str(corpus_dir / "web"), "weight": 0.7},
            {
                "name": "code",
                "path": str(corpus_dir / "code" / "*.parquet"),
                "weight": 0.3,
                "text_field": "content",
                "on_error": "skip",
            },
        ],
        "pipeline": [
            {"decode_text": {}},
            {"tokenize": {"tokenizer": "byte"}},
            {"batch": {"microbatch_size": 8}},
        ],
        "execution": {"runner": "threads", "workers": 4, "deterministic": True},
    }


def test_binding_example_loads_and_explains(tmp_path, corpus_dir):
    path = write(tmp_path, yaml.safe_dump(base_config(corpus_dir)))
    pipeline, execution = load_config(path)
    assert (pipeline.seed, pipeline.lanes, pipeline.chunk_size) == (1234, 8, 256)
    assert execution.runner == "threads" and execution.workers == 4
    text = pipeline.explain(execution)
    for needle in (
        "stage 0 [threads]",
        "fetch()",
        "decode_text()",
        "tokenize(",
        "batch(",
        "microbatch=8",
        "parallelism=4",
        "web: weight=0.7",
        "code: weight=0.3",
    ):
        assert needle in text


def test_relative_paths_resolve_against_the_config_file(tmp_path, corpus_dir):
    import shutil

    shutil.copytree(corpus_dir / "web", tmp_path / "data" / "web")
    cfg = base_config(corpus_dir)
    cfg["datasets"] = [{"name": "web", "path": "data/web", "weight": 1}]
    pipeline, execution = load_config(write(tmp_path, yaml.safe_dump(cfg)))
    assert pipeline.plan(execution).datasets[0].num_rows > 0


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c["pipeline"].insert(1, {"detokenize": {}}), "unknown operator 'detokenize'"),
        (
            lambda c: c["pipeline"][1]["tokenize"].update(tokeniser="byte"),
            "pipeline\\[1\\].tokenize: unknown parameter 'tokeniser'",
        ),
        (lambda c: c["datasets"][0].update(path="/nonexistent/web"), "does not exist"),
        (lambda c: c["datasets"][0].update(weight=0), "weight must be > 0"),
        (lambda c: c["datasets"][0].update(weight=-1), "weight must be > 0"),
        (lambda c: c["datasets"][0].update(on_error="ignore"), "on_error"),
        (lambda c: c.update(lanes=0), "lanes: must be an integer >= 1"),
        (lambda c: c.update(shuffle_seed=3), "unknown top-level key 'shuffle_seed'"),
        (lambda c: c["execution"].update(runner="gpu"), "unknown runner 'gpu'"),
        (lambda c: c["execution"].update(workers=0), "execution.workers"),
        (lambda c: c["pipeline"].pop(), "last operator must be 'batch'"),
        (lambda c: c["pipeline"][2]["batch"].update(microbatch_size=0), "microbatch_size"),
        (
            lambda c: c["pipeline"][1]["tokenize"].update(tokenizer="missing/tokenizer.json"),
            "does not exist",
        ),
        (lambda c: c.pop("datasets"), "missing required key 'datasets'"),
        (lambda c: c["datasets"][0].pop("weight"), "missing required key 'weight'"),
    ],
)
def test_bad_configs_fail_at_load_naming_the_problem(tmp_path, corpus_dir, mutate, message):
    cfg = base_config(corpus_dir)
    mutate(cfg)
    with pytest.raises(ConfigError, match=message):
        pipeline, execution = load_config(write(tmp_path, yaml.safe_dump(cfg)))
        pipeline.plan(execution)


def test_no_files_in_dataset_dir(tmp_path, corpus_dir):
    (tmp_path / "empty").mkdir()
    cfg = base_config(corpus_dir)
    cfg["datasets"][0]["path"] = str(tmp_path / "empty")
    pipeline, execution = parse_config(cfg)
    with pytest.raises(ConfigError, match=r"no .*files"):
        pipeline.plan(execution)


def test_an_operators_own_message_names_it_once(tmp_path, corpus_dir):
    cfg = base_config(corpus_dir)
    cfg["pipeline"].insert(2, {"pack_flat": {"max_length": 0}})
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, yaml.safe_dump(cfg)))
    assert str(err.value).startswith("pipeline[2].pack_flat: max_length must be an integer")
