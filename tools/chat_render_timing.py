"""Time ``ChatTemplate.render`` on a real template, optionally against another checkout.

Renders ``generate_conversations(50, seed=5)`` with the chat template of a tokenizer directory
(default Qwen3's, ``build/tokenizers/qwen3``, fetched by ``make tokenizers``) and prints the
best per-render time. With ``--baseline DIR`` (the ``server/`` directory of another checkout,
e.g. a ``git worktree`` of main), both versions are loaded side by side in this process and
timed in alternating rounds, which cancels most of the noise of a shared machine; their
outputs must be identical. docs/decisions.md ("Chat-template render budget") quotes it.

Usage: ``PYTHONPATH=server python tools/chat_render_timing.py [--baseline ../main/server]``
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import sys
import timeit
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def load(server_dir: Path, tokenizer: str) -> Any:
    """A ``ChatTemplate`` built by the ``zephon_server`` package found in ``server_dir``."""
    for name in [m for m in sys.modules if m.split(".")[0] == "zephon_server"]:
        del sys.modules[name]
    sys.path.insert(0, str(server_dir))
    try:
        ct = importlib.import_module("zephon_server.engine.chat_template")
    finally:
        sys.path.remove(str(server_dir))
    source = ct.find_template(tokenizer, None)
    return ct.ChatTemplate(source, date=datetime.date(2026, 1, 1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default=str(ROOT / "build/tokenizers/qwen3/tokenizer.json"))
    parser.add_argument("--baseline", type=Path, help="server/ directory of another checkout")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    from zephon_server.engine.chat_corpus import generate_conversations

    convs = [c["messages"] for c in generate_conversations(50, seed=5)]
    versions = {"this": load(ROOT / "server", args.tokenizer)}
    if args.baseline is not None:
        versions = {"baseline": load(args.baseline, args.tokenizer), **versions}
    outputs = {name: [t.render(c) for c in convs] for name, t in versions.items()}
    assert len({tuple(o) for o in outputs.values()}) == 1, "the versions render differently"
    best = dict.fromkeys(versions, float("inf"))
    for _ in range(args.rounds):
        for name, template in versions.items():
            took = timeit.timeit(lambda t=template: [t.render(c) for c in convs], number=20)
            best[name] = min(best[name], took / 20 / len(convs) * 1e6)
    for name, us in best.items():
        print(f"{name}: {us:.2f} us per render")
    if "baseline" in best:
        print(f"overhead: {100 * (best['this'] - best['baseline']) / best['baseline']:+.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
