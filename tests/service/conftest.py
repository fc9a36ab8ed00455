"""Fixtures the two halves of a split file share (see tests/README.md: a file that mixes tiers
is split, test bodies unchanged). They stay defined next to the hermetic tests that use them
too; importing them here makes them visible to the service half without an import that the
test's argument would shadow."""

from __future__ import annotations

from tests.unit.test_backpressure import make_hub  # noqa: F401
from tests.unit.test_determinism import oracle  # noqa: F401
from tests.unit.test_malformed import bad_shard  # noqa: F401
from tests.unit.test_render_chat import tok_dirs  # noqa: F401
from tests.unit.test_replay_cache import specs  # noqa: F401
from tests.unit.test_resume import small_specs  # noqa: F401
from tests.unit.test_stateful_pipeline import oracles  # noqa: F401
from tests.unit.test_tokenizer import bpe_path  # noqa: F401
from tests.unit.test_trainer_tensors import yaml_oracle  # noqa: F401
