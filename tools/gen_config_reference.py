"""Generates docs/config-reference.md from the code, so the reference matches what it accepts.

    python tools/gen_config_reference.py          # rewrite docs/config-reference.md
    python tools/gen_config_reference.py --check  # exit 1 if the file is out of date

Names, types, defaults, allowed values and the operator list come from the code: the config
loader's top-level keys (``engine/config.py``), the fields of ``DatasetSpec`` and
``ExecutionConfig``, every operator in ``engine/ops.OPERATORS`` with the parameters its
constructor accepts (``Operator.accepted_params()``) and the first line of its docstring, and
the ``zephon`` command-line parser. The one-line meanings below are written by hand; a key or
parameter without one stops the generator, so a new setting cannot go undocumented.
``tests/unit/test_docs.py`` fails when the checked-in page differs from what this prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from pathlib import Path
from typing import Any

from zephon_server.cli import build_parser
from zephon_server.engine.chat_layout import TRAIN_ON
from zephon_server.engine.config import TOP_LEVEL_KEYS
from zephon_server.engine.datasets import EXHAUSTION_POLICIES, ON_ERROR_POLICIES, DatasetSpec
from zephon_server.engine.execution import (
    PROGRAM_FIELDS,
    RUNNERS,
    TOP_LEVEL_FIELDS,
    ExecutionConfig,
)
from zephon_server.engine.ops import OPERATORS
from zephon_server.engine.ops.base import EXECUTION_PARAMS, PLACEMENTS
from zephon_server.engine.ops.mixture import MIXTURE_UNITS
from zephon_server.engine.ops.packing import ALGORITHMS, OVERSIZED_POLICIES
from zephon_server.engine.ops.shuffle import SHUFFLE_ALGORITHMS
from zephon_server.engine.pipeline import Pipeline
from zephon_server.engine.shards import EXTENSIONS, FORMATS
from zephon_server.engine.storage.options import StorageOptions

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "config-reference.md"
REQUIRED = "*required*"


def _choices(values: Any) -> str:
    return ", ".join(f"`{v}`" for v in values)


TOP_LEVEL = {
    "seed": "Seed of every data-derived random choice (work-source order, lane routing, shuffle).",
    "lanes": "Number of lanes `L`, fixed for the whole training run. Any data-parallel size "
    "dividing `L` reads the same per-lane streams.",
    "chunk_size": "Sample pointers per chunk: the unit of scheduling, lane routing and replay.",
    "flush_every_k_chunks": "A flush sentinel (epoch boundary) every K chunks per lane. Resume "
    "replays at most K chunks per lane; stateful operators reset there.",
    "end_of_data": "Where the lanes of a finite stream (every dataset `exhaustion: stop`) end: "
    "`shortest` ends every lane at the seq where the shortest lane ended, so every "
    "data-parallel rank takes the same number of steps (what the longer lanes make beyond it "
    "is cut, counted as dropped); `longest` runs each lane to its own end. Shapes the data: "
    "`longest` enters the fingerprint. The common end needs every lane in one server "
    "(a lane-sharded server refuses `shortest` on finite data).",
    "datasets": "The datasets (see below); a non-empty list.",
    "pipeline": "The operator chain (see below); a non-empty list ending with `batch`.",
    "execution": "How the pipeline runs (see below). Never changes the data.",
    "index_dir": "Where the shard index (every shard's row count and row offsets) is kept "
    "between runs, relative to the config file; `none` keeps it in memory only. The "
    "`--index-dir` flag wins; unset: `<state-dir>/index` with `serve --state-dir`, else "
    "`$XDG_CACHE_HOME/zephon/index` (`~/.cache/zephon/index`). Never changes the data.",
    "index_max_bytes": "Disk the index directory may take: bytes, or with a `K`/`M`/`G`/`T` "
    "suffix (`10G`). Unset: a tenth of its filesystem, at most 32 GiB. Entries no catalog "
    "refers to go first, then the least recently used catalogs' entries; never those of the "
    "datasets in use. The `--index-max-bytes` flag wins. Never changes the data.",
    "spill_max_bytes": "Disk for the decompressed content of `.jsonl.gz` / single-frame "
    "`.jsonl.zst` shards over 64 MiB (spill files in `<index_dir>/spill`, else a temporary "
    "directory): bytes or `50G`. Unset: a tenth of its filesystem, at most 64 GiB. Least "
    "recently used files go first. The `--spill-max-bytes` flag wins. Never changes the data.",
}

DATASET = {
    "name": "Unique name; used by `ensure_mixture.weights`, metrics labels and errors.",
    "path": "A directory (every shard file below it with a supported extension, hidden files "
    "skipped), one file, or a glob pattern (`**` allowed). Relative paths resolve against the "
    "config file's directory. Or an object-store URL: `s3://bucket/prefix/`, "
    "`s3://bucket/key.jsonl.zst`, `s3://bucket/cc/**/*.parquet`.",
    "weight": "Mixture weight, > 0. Weights are relative: 0.7/0.3 and 7/3 are the same mixture.",
    "text_field": "JSON field (JSONL) or column (Parquet) holding the text.",
    "on_error": "`fail`: a malformed or unreadable record stops the pipeline with an error "
    "naming file and line. `skip`: it becomes a tombstone and is counted in "
    "`zephon_records_skipped_total`.",
    "exhaustion": "`stop`: when the dataset runs out it leaves the mixture and the others keep "
    "their weights; the stream ends when every dataset is out. `repeat`: a new pass in a new "
    "order.",
    "format": "Override the format inferred from the extension (use with a glob for files "
    "without a supported extension).",
    "storage_options": "How to reach an object-store `path` (`s3://bucket/prefix/`, one object "
    "or a glob): see `datasets[].storage_options` below. Not in the fingerprint; secrets are "
    "never shown.",
    "max_document_bytes": "The largest document in bytes (a JSONL line without its newline, a "
    "Parquet value's UTF-8 or binary length), >= 1. A larger one follows `on_error`: `fail` "
    "stops naming file, line, size and limit; `skip` drops it as `too_large` (a plain JSONL "
    "line that long is not even read).",
    "record_columns": "`render_chat` pipelines: the Parquet columns that make one record, read "
    "as `{column: value}` (`[prompt, completion]`, `[messages, tools]`), where one JSON "
    "column cannot hold it. `max_document_bytes` bounds each column's value. Unset: the "
    "`text_field` column. A JSONL record is read whole either way.",
}

STORAGE = {
    "endpoint_url": "S3 endpoint, e.g. `http://127.0.0.1:9000` (default: `$AWS_ENDPOINT_URL_S3`, "
    "`$AWS_ENDPOINT_URL`, else AWS).",
    "region": "Region (default: `$AWS_REGION` / `$AWS_DEFAULT_REGION`, the profile's, else "
    "`us-east-1`).",
    "access_key": "Access key id (default: the standard AWS credential chain: "
    "`AWS_ACCESS_KEY_ID`, `AWS_PROFILE`, `~/.aws/credentials`, instance roles). With "
    "`secret_key`.",
    "secret_key": "Secret access key (never logged or shown).",
    "session_token": "Session token of temporary credentials (never logged or shown).",
    "anonymous": "Unsigned requests, for public buckets.",
    "max_concurrency": "Requests in flight per bucket and process (a semaphore).",
    "retry_attempts": "Attempts per request, the first included, on throttling (429, 503 "
    "SlowDown), 5xx and connection resets/timeouts; then the read is a data error under "
    "`on_error`.",
    "retry_base_s": "Backoff base: retry k waits a uniform draw from [0, min(cap, base * "
    "2^(k-1))] seconds (full jitter).",
    "retry_cap_s": "Backoff cap in seconds.",
    "request_timeout_s": "A request that receives no byte for this many seconds fails as a "
    "network error and is retried (the SDK's default: 3; on Linux too). For gs://: the longest "
    "one request may take with Google's own retries (default 10).",
    "connect_timeout_s": "Seconds to open a connection before it fails as a network error and "
    "is retried (the SDK's default: 1).",
}

EXECUTION = {
    "runner": "`inline` (one thread, the reference), `threads`, `processes` (spawned worker "
    "processes, arrays through shared memory) or `ray` (map-like stages on Ray actors).",
    "workers": "Workers per step (an operator's `parallelism` overrides it).",
    "deterministic": "`false` forwards results in completion order and allows latency "
    "flushes: each record is still delivered once, but the order may change between runs.",
    "fuse": "Run consecutive stateless operators in one worker call.",
    "queue_depth": "Item lists buffered between steps.",
    "ray_address": "Ray cluster for the Ray runner (`auto`, `ray://head:10001`, `local`); "
    "`zephon` commands let `$ZEPHON_RAY_ADDRESS` override it; unset: a private local Ray.",
}

EXECUTION_ONLY = {
    "parallelism": "Workers for this operator's step (default: `execution.workers`; "
    "`ensure_mixture`, packing, `shuffle` and `batch` run in their driver thread).",
    "microbatch_size": "Elements per `process_many` call (default: the operator's own, listed "
    "with each operator). For `batch` it is the batch size and shapes the data.",
    "placement": f"One of {_choices(PLACEMENTS)}: `remote` runs the operator's stage on Ray "
    "(needs the `ray` extra).",
}

OPERATOR_PARAMS: dict[str, dict[str, str]] = {
    "decode_text": {},
    "tokenize": {
        "tokenizer": "`byte` (built-in: UTF-8 bytes 0-255, BOS 256, EOS 257, PAD 258), a path "
        "to a Hugging Face `tokenizer.json` (relative to the config file), or a hub id (needs "
        "network).",
        "add_bos": "Prepend the BOS token to every document.",
        "add_eos": "Append the EOS token to every document.",
        "max_length": "Split longer documents into pieces of at most this many tokens (each "
        "piece is its own record). Unset: never split here.",
    },
    "render_chat": {
        "tokenizer": "Path to a Hugging Face `tokenizer.json` (relative to the config file); "
        "its directory's `chat_template.jinja` or `tokenizer_config.json` (`chat_template`, "
        "special tokens) supply the template unless `template` is set. `byte` works with "
        "`template`.",
        "messages_field": "JSON field holding the conversation: a list of `{role, content}` "
        "objects.",
        "template": "A Jinja chat template file (relative to the config file). Unset: the "
        "tokenizer's template.",
        "train_on": f"One of {_choices(TRAIN_ON)}: which turns' content and end-of-turn "
        "token are trained (`loss_mask` 1).",
        "max_length": "Keep the first `max_length` tokens. A cut that removes every trained "
        "token is a data error (`mask_truncated`). Unset: never cut here.",
        "system_prompt": "Prepended as a `system` message to conversations that do not start "
        "with one. Unset: none.",
        "prompt_field": "Field of the prompt in prompt/completion records (used when a record "
        "has no messages field).",
        "completion_field": "Field of the completion in prompt/completion records; the "
        "completion is trained.",
        "completion_eos": "Append the EOS token (the template's `eos_token`, else the "
        "tokenizer's) to completions, trained.",
        "max_messages": "The most messages a conversation may have (more is a `chat_error`).",
        "date": "The date the template's `strftime_now` formats (fixed, so the output never "
        "depends on the clock).",
        "reasoning_field": "Field of a message holding its reasoning (a string or null), which "
        "templates such as Qwen3's write in a `<think>` block before the content.",
        "train_reasoning": "Train a trained turn's reasoning where the template writes it: "
        "from the end of the generation prompt (the `<think>` tag included) to the end of "
        "turn. `false`: only the content and end of turn.",
        "tools_field": "Field of a record holding its tool definitions (a list of objects, or "
        "null), passed to the template as `tools`, as Hugging Face's "
        "`apply_chat_template(tools=...)` does (Qwen3 writes them in the system turn; never "
        "trained).",
        "weight_field": "Field of a message whose 0 keeps that turn untrained whatever "
        "`train_on` says (the OpenAI fine-tuning format's `weight`); 1, null or missing: as "
        "`train_on` says; anything else is a `chat_error`.",
        "role_key": "Key of a message's role in the corpus (ShareGPT: `from`); renamed to "
        "`role` for the template.",
        "content_key": "Key of a message's content in the corpus (ShareGPT: `value`); renamed "
        "to `content` for the template.",
        "role_names": "The corpus's role names mapped to the template's (ShareGPT: `{system: "
        "system, human: user, gpt: assistant}`); a role not named is kept. Unset: none.",
        "template_kwargs": "Extra variables for the template, as the keyword arguments of "
        "Hugging Face's `apply_chat_template` (e.g. `{enable_thinking: false}`); not "
        "`messages`, `tools`, `documents` or `add_generation_prompt`, nor one the template "
        "never reads.",
        "text_datasets": "Datasets whose records are plain text (the dataset's `text_field`), "
        "not conversations: tokenized as `decode_text` + `tokenize` make them (`max_length` "
        "splits a text into pieces as `tokenize`'s does; nothing is cut) and trained whole, to "
        "mix pretraining text into a chat pipeline. Unset: none (a record without messages is "
        "a `chat_error`).",
        "text_bos": "Put the tokenizer's BOS before each text of `text_datasets`, as "
        "`tokenize`'s `add_bos` does (Llama-style pretraining); refused when the tokenizer has "
        "none.",
        "text_eos": "Append the tokenizer's EOS (trained) to each text of `text_datasets`, as "
        "`tokenize`'s `add_eos` does; refused when the tokenizer has none (set it false).",
    },
    "map_transform": {
        "fn": "`module:function` taking a payload dict and returning a payload dict, or `None` "
        "to drop the record (tombstone `filtered`). Must be deterministic and importable "
        "(set `PYTHONPATH`).",
    },
    "pack_sequences": {
        "max_length": "Row capacity in tokens (the model's context length).",
        "algorithm": f"One of {_choices(ALGORITHMS)}: first open bin that fits, tightest bin that "
        "fits, or one bin cut at `max_length` (documents continue in the next row).",
        "max_open_bins": "Open bins per lane; when more are needed the oldest is emitted.",
        "min_useful_length": "A bin is emitted once its free room drops below this. Unset: "
        "`max(1, max_length // 32)`.",
        "oversized": f"One of {_choices(OVERSIZED_POLICIES)}: cut documents longer than "
        "`max_length`, or drop them (tombstone `oversized`).",
        "emit_labels": "Add `labels`: `input_ids[p + 1]` where `p + 1` is in the same document "
        "piece and trained (`loss_mask` 1, or no `loss_mask`), else `ignore_index`. Boundaries "
        "come from the packer, never from EOS ids. Inputs that carry `labels` are an error.",
        "ignore_index": "Label of ignored positions (last of a piece, padding, untrained "
        "targets); a negative integer. `pack_sequences` needs -100 (batch padding).",
        "emit_cu_seqlens": "Add per row `cu_seqlens` (int32 `[max_docs_per_row + 1]`, the last "
        "value repeated after `num_docs`; padding is not a document), `num_docs` and "
        "`max_seqlen`. Needs `max_docs_per_row`.",
        "max_docs_per_row": "At most this many document pieces per row (a row closes when it has "
        "them). Unset: no limit.",
    },
    "pack_flat": {
        "max_length": "Row length in tokens; every row is padded to exactly this.",
        "algorithm": "As for `pack_sequences`.",
        "max_open_bins": "As for `pack_sequences`.",
        "min_useful_length": "As for `pack_sequences`.",
        "oversized": "As for `pack_sequences`.",
        "pad_id": "Padding id for `input_ids`. Unset: the tokenizer's pad id.",
        "emit_labels": "As for `pack_sequences`.",
        "ignore_index": "As for `pack_sequences` (any negative integer).",
        "emit_cu_seqlens": "As for `pack_sequences`; `cu_seqlens[num_docs]` = "
        "`padding_mask.sum()`.",
        "max_docs_per_row": "As for `pack_sequences`.",
    },
    "ensure_mixture": {
        "weights": "Dataset name to target weight. Unset: the datasets' `weight`s. Datasets "
        "with weight 0 or left out pass through.",
        "by": f"One of {_choices(MIXTURE_UNITS)}: what the shares count (`loss_tokens`: trained "
        "tokens, the `loss_mask` ones; all tokens of a record without one).",
        "buffer_size": "Records buffered per lane while waiting for the most-owed dataset.",
    },
    "shuffle": {
        "buffer_size": "Reservoir size (`streaming`) or block size (`block`, and the largest "
        "block of `block_warmup`).",
        "seed": "Combined with the pipeline `seed`.",
        "algorithm": f"One of {_choices(SHUFFLE_ALGORITHMS)}: a per-lane reservoir, "
        "shuffled blocks, or blocks that start small after every epoch boundary.",
        "warmup_size": "First block size of `block_warmup`, doubling up to `buffer_size` after "
        "each block and after each epoch boundary. Ignored by the other algorithms.",
    },
    "batch": {
        "microbatch_size": "Rows per batch (the per-step batch size of one lane).",
        "drop_last": "Never emit a partial batch: partial rows at the end of a lane become "
        "tombstones (`dropped_last`). `false`: a lane's last batch may be short.",
        "pad_id": "Padding id for `input_ids` when rows have different lengths. Unset: the "
        "tokenizer's pad id.",
    },
}


def _default(param: inspect.Parameter | Any) -> str:
    value = param.default if isinstance(param, inspect.Parameter) else param
    if value is inspect.Parameter.empty or value is dataclasses.MISSING:
        return REQUIRED
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _need(table: dict[str, str], key: str, where: str) -> str:
    if key not in table:
        raise SystemExit(
            f"gen_config_reference: no description for {where} {key!r}; add one to "
            "tools/gen_config_reference.py"
        )
    return table[key]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _first_line(obj: Any) -> str:
    """The first docstring line, reST markup turned into Markdown."""
    doc = inspect.getdoc(obj) or ""
    line = doc.strip().splitlines()[0] if doc.strip() else ""
    line = re.sub(r":\w+:`([^`]+)`", r"`\1`", line)
    line = line.replace("``", "`").replace(" (see the module docstring)", "")
    return line


def top_level_section() -> list[str]:
    sig = inspect.signature(Pipeline.__init__).parameters
    out = [
        "## Top-level keys",
        "",
        "| key | default | meaning |",
        "|---|---|---|",
    ]
    for key in TOP_LEVEL_KEYS:
        if key in sig:
            default = _default(sig[key])
        elif key in ("datasets", "pipeline"):
            default = REQUIRED
        elif key in TOP_LEVEL_FIELDS:
            default = "unset"
        else:
            default = "`{}` (all defaults)"
        out.append(f"| `{key}` | {default} | {_cell(_need(TOP_LEVEL, key, 'top-level key'))} |")
    return out


def dataset_section() -> list[str]:
    allowed = {
        "on_error": ON_ERROR_POLICIES,
        "exhaustion": EXHAUSTION_POLICIES,
        "format": FORMATS,
    }
    out = [
        "## `datasets[]`",
        "",
        "Each entry is a mapping. Supported shard files: "
        + ", ".join(f"`{ext}`" for ext in EXTENSIONS)
        + ".",
        "",
        "| key | type | default | allowed | meaning |",
        "|---|---|---|---|---|",
    ]
    for f in dataclasses.fields(DatasetSpec):
        values = ", ".join(f"`{v}`" for v in allowed.get(f.name, ()))
        meaning = _cell(_need(DATASET, f.name, "dataset key"))
        kind = _cell(f"`{f.type}`")
        out.append(f"| `{f.name}` | {kind} | {_default(f.default)} | {values} | {meaning} |")
    return out


def storage_section() -> list[str]:
    out = [
        "## `datasets[].storage_options`",
        "",
        "Optional, for object-store paths only; unknown keys are rejected.",
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for f in dataclasses.fields(StorageOptions):
        meaning = _cell(_need(STORAGE, f.name, "storage_options key"))
        kind = _cell(f"`{f.type}`")
        out.append(f"| `{f.name}` | {kind} | {_default(f.default)} | {meaning} |")
    return out


def execution_section() -> list[str]:
    out = [
        "## `execution`",
        "",
        "Pure performance settings: they are not part of the pipeline fingerprint, so a resume "
        "may change every one of them. `zephon explain|dump|serve --runner R --workers N` "
        "override `runner` and `workers`.",
        "",
        "| key | type | default | allowed | meaning |",
        "|---|---|---|---|---|",
    ]
    for f in dataclasses.fields(ExecutionConfig):
        if f.name in TOP_LEVEL_FIELDS or f.name in PROGRAM_FIELDS:
            continue  # a top-level key (see above), or set by the program, not by YAML
        values = ", ".join(f"`{v}`" for v in RUNNERS) if f.name == "runner" else ""
        meaning = _cell(_need(EXECUTION, f.name, "execution key"))
        kind = _cell(f"`{f.type}`")
        out.append(f"| `{f.name}` | {kind} | {_default(f.default)} | {values} | {meaning} |")
    return out


def operators_section() -> list[str]:
    out = [
        "## `pipeline[]`: operators",
        "",
        "Each step is a one-key mapping, `- name: {parameters}` (or just `- name` when every "
        "parameter has its default). `fetch` is implicit and always first; `decode_text` is "
        "inserted when the chain does not start with it (unless it has `render_chat`, which "
        "comes first and replaces `decode_text` and `tokenize`); the chain must end with "
        "`batch`. "
        "Every operator parameter below shapes the data and is part of the pipeline "
        "fingerprint, so a checkpoint only resumes with the same values.",
        "",
        "Every operator also accepts these execution-only parameters (not in the fingerprint, "
        "except `batch.microbatch_size`):",
        "",
        "| parameter | default | meaning |",
        "|---|---|---|",
    ]
    base = OPERATORS["decode_text"].accepted_params()
    for name in EXECUTION_PARAMS:
        meaning = _cell(_need(EXECUTION_ONLY, name, "execution-only parameter"))
        out.append(f"| `{name}` | {_default(base[name])} | {meaning} |")
    for op_name, cls in OPERATORS.items():
        table = OPERATOR_PARAMS.get(op_name)
        if table is None:
            raise SystemExit(
                f"gen_config_reference: no entry for operator {op_name!r}; add it to "
                "OPERATOR_PARAMS in tools/gen_config_reference.py"
            )
        params = {
            k: p
            for k, p in cls.accepted_params().items()
            if k != "kwargs" and (k not in EXECUTION_PARAMS or k in table)
        }
        out += ["", f"### `{op_name}`", "", _first_line(cls), ""]
        mb = params.get("microbatch_size")
        if mb is None or mb.default is None:
            out.append(f"Default micro-batch: {cls.default_microbatch_size} elements.")
            out.append("")
        if not params:
            out.append("No parameters of its own.")
            continue
        out += ["| parameter | type | default | meaning |", "|---|---|---|---|"]
        for key, param in params.items():
            meaning = _cell(_need(table, key, f"{op_name} parameter"))
            annotation = param.annotation
            kind = _cell(f"`{annotation}`") if annotation is not inspect.Parameter.empty else ""
            out.append(f"| `{key}` | {kind} | {_default(param)} | {meaning} |")
    return out


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
    ]


CLI_HELP = {
    "--format": "`text`: one line per batch; `json`: tensors and row sources; `digest`: "
    "`<lane> <seq> <chain digest>`; `decoded`: each row decoded by the pipeline's tokenizer, "
    "its documents on lines of their own with trained runs marked `train:` (as `zephon tail` "
    "prints them)",
}


def cli_section() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = [
        "## Command line",
        "",
        "`zephon [-v] COMMAND ...` (`-v`: debug logging). Errors print `zephon: error: ...` and "
        "exit with status 2.",
    ]
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    for command, p in sub.choices.items():
        summary = helps.get(command) or ""
        out += ["", f"### `zephon {command}`", "", f"{summary[:1].upper()}{summary[1:]}.", ""]
        out += ["| flag | default | meaning |", "|---|---|---|"]
        for action in _actions(p):
            flags = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
            if action.choices:
                flags += " (" + ", ".join(f"`{c}`" for c in action.choices) + ")"
            if action.required:
                default = REQUIRED
            elif isinstance(action, argparse._StoreTrueAction) or action.default is None:
                default = ""
            else:
                default = f"`{action.default}`"
            if action.help:  # formatted as --help shows it (%(default)s and the like)
                meaning = action.help % {**vars(action), "prog": p.prog}
            else:
                meaning = _need(CLI_HELP, action.option_strings[0], "flag")
            out.append(f"| {flags} | {default} | {_cell(meaning)} |")
    return out


def generate() -> str:
    """The whole page."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by tools/gen_config_reference.py from the code. Do not edit: run "
        "`python tools/gen_config_reference.py`. -->",
        "",
        "Everything a pipeline YAML file accepts, with defaults, generated from the code. "
        "[Writing pipelines](pipelines.md) explains how to use it. The same names work in "
        "Python: `Pipeline(datasets, seed=..., lanes=...)`, `DatasetSpec(name, path, weight, "
        "...)`, `pipeline.<operator>(**parameters)` and `ExecutionConfig(...)`.",
        "",
        *top_level_section(),
        "",
        *dataset_section(),
        "",
        *storage_section(),
        "",
        *operators_section(),
        "",
        *execution_section(),
        "",
        *cli_section(),
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is outdated")
    args = parser.parse_args()
    text = generate()
    if args.check:
        if OUTPUT.read_text() != text:
            print(f"{OUTPUT} is out of date: run python tools/gen_config_reference.py")
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
