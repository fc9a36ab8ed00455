"""The operator contract as enforced by the code: abstract base classes, a required
``preserves_cursor_order``, and stalling asked of the operator but honoured only for the
built-in ``batch(drop_last=True)``."""

from __future__ import annotations

import pickle

import pytest

from tests.support.builders import make_pipeline
from zephon_server.api import (
    Accumulator,
    Batch,
    ContractError,
    CountingAccumulator,
    ExecutionConfig,
    Operator,
    OpTraits,
    PassthroughAccumulator,
)
from zephon_server.engine.chat_corpus import write_chatml_template
from zephon_server.engine.ops import OPERATORS, Fetch
from zephon_server.engine.ops.replay import ReplayFilter
from zephon_server.engine.runners.steps import Step


class Passing(Operator):
    """A minimal complete operator."""

    op_name = "passing"

    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems):
        return elems


# -- OpTraits ------------------------------------------------------------------------------


def test_preserves_cursor_order_has_no_default():
    with pytest.raises(TypeError, match="preserves_cursor_order"):
        OpTraits()
    with pytest.raises(TypeError, match="preserves_cursor_order"):
        OpTraits(fusable=False)
    with pytest.raises(TypeError):
        OpTraits(True)  # keyword only: a bare True says nothing about which flag
    traits = OpTraits(preserves_cursor_order=False)
    assert traits.preserves_cursor_order is False and traits.fusable is True


def test_optraits_values_are_validated():
    with pytest.raises(ValueError, match="preserves_cursor_order must be a bool"):
        OpTraits(preserves_cursor_order="yes")


class OmitsOrder(Passing):
    op_name = "omits_order"

    def traits(self):
        return OpTraits(fusable=False)


class ReturnsDict(Passing):
    op_name = "returns_dict_traits"

    def traits(self):
        return {"preserves_cursor_order": True}


class BrokenTraits(Passing):
    op_name = "broken_traits"

    def traits(self):
        return len(None)  # a TypeError of the operator's own, not about OpTraits


def test_omitted_preserves_cursor_order_names_the_operator_and_the_fix(corpus_specs):
    pipe = make_pipeline(corpus_specs)
    with pytest.raises(ContractError) as info:
        pipe.apply(OmitsOrder())
    message = str(info.value)
    assert "'omits_order'" in message and "OmitsOrder.traits" in message
    assert "preserves_cursor_order=True|False" in message
    assert isinstance(info.value.__cause__, TypeError)
    assert not any(isinstance(op, OmitsOrder) for op in pipe.ops)


def test_traits_that_are_not_optraits_are_refused():
    with pytest.raises(ContractError, match=r"'returns_dict_traits': traits\(\) returned dict"):
        ReturnsDict().declared_traits()


def test_an_unrelated_type_error_in_traits_is_not_disguised():
    with pytest.raises(TypeError, match="NoneType") as info:
        BrokenTraits().declared_traits()
    assert not isinstance(info.value, ContractError)


def test_planner_checks_traits_of_operators_added_behind_the_builder(corpus_specs):
    pipe = make_pipeline(corpus_specs).batch(microbatch_size=4)
    pipe.ops.insert(0, OmitsOrder())  # bypasses apply(): the planner still refuses it
    with pytest.raises(ContractError, match="'omits_order'"):
        pipe.plan(ExecutionConfig(runner="inline"))


def test_every_builtin_operator_declares_its_traits(tmp_path):
    # traits() is abstract: building each built-in proves it declares its own.
    template = write_chatml_template(tmp_path / "chatml.jinja")
    args = {**BUILTIN_ARGS, "render_chat": {"tokenizer": "byte", "template": str(template)}}
    ops = {name: cls(**args.get(name, {})) for name, cls in OPERATORS.items()}
    ops |= {"fetch": Fetch(), "replay_filter": ReplayFilter()}
    traits = {name: op.declared_traits() for name, op in ops.items()}
    reordering = {name for name, t in traits.items() if not t.preserves_cursor_order}
    assert reordering == {"ensure_mixture", "pack_flat", "pack_sequences", "shuffle"}
    fusable = {name for name, t in traits.items() if t.fusable}
    assert fusable == {"fetch", "decode_text", "tokenize", "map_transform", "render_chat"}


BUILTIN_ARGS = {
    "map_transform": {"fn": "builtins:dict"},
    "pack_flat": {"max_length": 64},
    "pack_sequences": {"max_length": 64},
}


# -- abstract base classes -------------------------------------------------------------------


def test_operator_missing_required_methods_cannot_be_built():
    class Nothing(Operator):
        op_name = "nothing"

    with pytest.raises(TypeError) as info:
        Nothing()
    message = str(info.value)
    assert "Nothing" in message and "process_many()" in message and "traits()" in message
    assert "docs/custom-operators.md" in message

    class OnlyTraits(Operator):
        def traits(self):
            return OpTraits(preserves_cursor_order=True)

    with pytest.raises(TypeError, match=r"OnlyTraits: it must implement process_many\(\)"):
        OnlyTraits()


def test_operator_defaults_for_the_optional_methods():
    op = Passing(microbatch_size=5)
    acc = op.accumulator(deterministic=True, ctx=None)
    assert type(acc) is CountingAccumulator and acc.max_batch == 5
    assert acc.max_latency_ms is None  # deterministic: no time-based boundaries
    assert op.accumulator(deterministic=False, ctx=None).max_latency_ms == op.max_latency_ms
    assert op.process_one("x") == ["x"]  # one-element process_many
    assert op.stalls_at_sentinel() is False


def test_operators_still_pickle_for_worker_processes():
    op = pickle.loads(pickle.dumps(Passing(microbatch_size=3)))
    assert isinstance(op, Passing) and op.microbatch_size == 3


def test_accumulator_missing_required_methods_cannot_be_built():
    class PushOnly(Accumulator):
        def push_many(self, elems):
            return [list(elems)]

    with pytest.raises(TypeError) as info:
        PushOnly()
    message = str(info.value)
    assert "accumulator class PushOnly" in message
    assert "flush()" in message and "has_pending_data()" in message
    assert "push_many" not in message

    class Complete(PushOnly):
        def flush(self, *, reset=False, lane_id=None):
            return []

        def has_pending_data(self, lane_id=None):
            return False

    acc = Complete()
    assert acc.try_epoch_reset(3, 0) is True  # the spec's conservative default
    assert acc.reads_payload is False
    assert isinstance(PassthroughAccumulator(), Accumulator)


def test_base_classes_themselves_cannot_be_built():
    with pytest.raises(TypeError, match="operator class Operator"):
        Operator()
    with pytest.raises(TypeError, match="accumulator class Accumulator"):
        Accumulator()


# -- stalling: asked of the operator, honoured for the built-in batch only -----------------------


def test_the_step_asks_the_operator_whether_it_stalls(monkeypatch):
    assert Step([Batch(microbatch_size=2, drop_last=True)], 0).stalls is True
    assert Step([Batch(microbatch_size=2, drop_last=False)], 0).stalls is False
    # The answer comes from the hook, not from the class: a batch answering False does not stall.
    monkeypatch.setattr(Batch, "stalls_at_sentinel", lambda self: False)
    assert Step([Batch(microbatch_size=2, drop_last=True)], 0).stalls is False


class WantsToStall(Passing):
    op_name = "wants_to_stall"

    def stalls_at_sentinel(self):
        return True


class MyBatch(Batch):
    """A subclass of the built-in batch: not the built-in, so it may not stall."""


def test_a_custom_operator_that_claims_to_stall_is_a_contract_error(corpus_specs):
    with pytest.raises(ContractError) as info:
        Step([WantsToStall()], 0)
    message = str(info.value)
    assert "'wants_to_stall'" in message and "only the built-in batch(drop_last=True)" in message
    pipe = make_pipeline(corpus_specs).apply(WantsToStall()).batch(microbatch_size=4)
    with pytest.raises(ContractError, match="'wants_to_stall'"):
        pipe.plan(ExecutionConfig(runner="inline"))


def test_a_subclass_of_batch_may_not_stall_but_may_flush(corpus_specs):
    with pytest.raises(ContractError, match=r"\(MyBatch\).*only the built-in"):
        Step([MyBatch(microbatch_size=2, drop_last=True)], 0)
    assert Step([MyBatch(microbatch_size=2, drop_last=False)], 0).stalls is False


def test_a_stalling_operator_fused_behind_the_head_is_refused():
    with pytest.raises(ContractError, match="'wants_to_stall'"):
        Step([Passing(), WantsToStall()], 0)
    with pytest.raises(ContractError, match="'wants_to_stall'"):
        Step([Batch(microbatch_size=2, drop_last=True), WantsToStall()], 0)


def test_plan_marks_only_the_stalling_batch(corpus_specs):
    plan = make_pipeline(corpus_specs).batch(microbatch_size=4).plan(ExecutionConfig("inline"))
    stalling = [step.name for stage in plan.stages for step in stage.steps if step.stalls]
    assert stalling == ["batch"]
    assert "stalls-at-sentinel" in plan.explain()
