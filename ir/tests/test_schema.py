"""The IR schema: lossless JSON round trips, the golden copy, and the version check."""

import json

import pytest
import sympy
import torch

import ember.ir as ir
from ember.ir import codec, schema
from ember.ir.golden_examples import example_artifact, example_graph_ir


def test_schema_matches_golden():
    schema.check_golden()


def test_schema_change_without_bump_is_caught(monkeypatch):
    changed = schema.current_schema()
    changed["classes"]["TensorMeta"]["layout"] = "str"
    monkeypatch.setattr(schema, "current_schema", lambda: changed)
    with pytest.raises(AssertionError, match="bump"):
        schema.check_golden()


def test_released_examples_stay_readable():
    for path in sorted(schema.GOLDEN_DIR.glob("example_v*.json")):
        data = json.loads(path.read_text())
        art = ir.from_json(ir.CompiledArtifact, data["artifact"])
        assert art.ir_version in ir.READABLE_VERSIONS
        assert ir.to_json(art) == data["artifact"]


def test_example_artifact_is_pinned():
    golden = json.loads((schema.GOLDEN_DIR / f"example_v{ir.IR_VERSION}.json").read_text())
    assert ir.to_json(example_artifact()) == golden["artifact"]
    assert ir.to_json(example_graph_ir()) == golden["graph"]


def test_tensor_meta_round_trip_symbolic():
    s0, s1 = ir.sym("s0"), ir.sym("s1")
    meta = ir.TensorMeta(torch.bfloat16, (s0, 2 * s1, 3), (6 * s1, 3, 1), 0, "cpu", True)
    back = ir.loads(ir.TensorMeta, ir.dumps(meta))
    assert back == meta
    assert back.sizes[1] == 2 * s1 and back.dtype is torch.bfloat16


def test_tensor_meta_from_tensor_channels_last():
    t = torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last)
    meta = ir.TensorMeta.from_tensor(t)
    assert meta.strides == tuple(sympy.Integer(s) for s in t.stride())
    assert not meta.is_contiguous()
    assert ir.TensorMeta.from_tensor(t.contiguous()).is_contiguous()
    assert meta.nbytes() == t.numel() * 4


@pytest.mark.parametrize(
    "expr",
    [
        lambda s, t: ir.FloorDiv(s * t + 7, 4),
        lambda s, t: ir.ModularIndexing(s, 3, t),
        lambda s, t: sympy.Max(s, t) + sympy.Min(s, 2) * 3,
        lambda s, t: sympy.Le(s * 2, t),
        lambda s, t: sympy.And(sympy.Ge(s, 2), sympy.Ne(t, 5)),
        lambda s, t: ir.CeilDiv(s, 128) * t**2,
    ],
)
def test_expression_round_trip(expr):
    s, t = ir.sym("s"), ir.sym("t")
    e = expr(s, t)
    assert ir.symbols.expr_from_json(json.loads(json.dumps(ir.symbols.expr_to_json(e)))) == e


def test_unknown_expression_head_rejected():
    with pytest.raises(ValueError, match="unknown expression head"):
        ir.symbols.expr_from_json(["__import__", 1])


def test_integer_functions_fold_constants():
    assert ir.FloorDiv(sympy.Integer(17), 5) == 3
    assert ir.CeilDiv(sympy.Integer(17), 5) == 4
    assert ir.ModularIndexing(sympy.Integer(17), 2, 5) == 3
    assert ir.FloorDiv(ir.sym("s"), 1) == ir.sym("s")


def test_exact_quotients_fold():
    """A positive divisor of every coefficient divides exactly (a view's -1 of 128*s0 elements in
    rows of 128 is s0, which a reshape must see); anything else stays a division."""
    s, t = ir.sym("s"), ir.sym("t")
    assert ir.FloorDiv(128 * s, 128) == s and ir.CeilDiv(6 * s * t + 3, 3) == 2 * s * t + 1
    assert isinstance(ir.FloorDiv(s + 15, 16), ir.FloorDiv)
    assert isinstance(ir.CeilDiv(3 * s, 2), ir.CeilDiv)
    assert isinstance(ir.FloorDiv(s * t, t), ir.FloorDiv)  # symbolic divisors are left alone


def test_exact_quotient_of_polynomials():
    """The one test of exact division that dynamo, primtorch and inductor share."""
    from ember.ir.symbols import exact_quotient

    s, t = ir.sym("s"), ir.sym("t")
    assert exact_quotient(32 * s * t, t) == 32 * s
    assert exact_quotient(2 * s + 4, 2) == s + 2
    assert exact_quotient(s**2 - 1, s - 1) == s + 1
    assert exact_quotient(s, 2) is None and exact_quotient(s * t + 1, t) is None
    # integer divisors take a path without `cancel`: it agrees with the general one
    from ember.ir.symbols import _exact_quotient

    u = ir.FloorDiv(s, 3)
    for a in (6 * s * t + 12, 4 * s - 8 * t, 6 * u + 3 * s, 5 * s + 10, 0, 18, 7 * u, s * t):
        for d in (1, 2, 3, -3, 6):
            assert exact_quotient(a, d) == _exact_quotient(sympy.sympify(a), sympy.Integer(d))


def test_unknown_field_rejected():
    data = ir.to_json(example_artifact())
    data["surprise"] = 1
    with pytest.raises(ValueError, match="unknown fields"):
        ir.from_json(ir.CompiledArtifact, data)


def test_missing_field_and_wrong_scalar_type_rejected():
    data = ir.to_json(example_artifact())
    meta = ir.to_json(ir.TensorMeta(torch.float32, (2, 3), (3, 1), device="cpu"))
    assert ir.from_json(ir.TensorMeta, dict(meta)) == ir.TensorMeta(torch.float32, (2, 3), (3, 1))
    del meta["device"]  # has a default: fine
    assert ir.from_json(ir.TensorMeta, meta).device == "cpu"
    del meta["dtype"]  # has none
    with pytest.raises(ValueError, match="field 'dtype' missing"):
        ir.from_json(ir.TensorMeta, meta)
    meta = ir.to_json(ir.TensorMeta(torch.float32, (2,), (1,)))
    meta["requires_grad"] = "yes"
    with pytest.raises(TypeError, match="expected bool, found str"):
        ir.from_json(ir.TensorMeta, meta)
    # decoding the same class twice gives equal objects (decoders are built once per type)
    assert ir.from_json(ir.CompiledArtifact, data) == ir.from_json(ir.CompiledArtifact, data)
    assert ir.from_json(ir.CompiledArtifact, data) == example_artifact()


def test_argument_values_round_trip():
    values = (None, True, 3, 2.5, float("inf"), float("nan"), "x", torch.float16,
              torch.device("cpu"), torch.channels_last, [1, (2, 3)], ir.sym("s") + 1)  # fmt: skip
    back = codec.value_from_json(json.loads(json.dumps(codec.value_to_json(values))))
    assert len(back) == len(values)
    for a, b in zip(back, values):
        assert a == b or (a != a and b != b)  # NaN equals itself only by identity
        assert type(a) is type(b)


def test_version_check_names_versions():
    ir.require("primtorch", reads=(1,), writes=1)
    with pytest.raises(ir.IRVersionError, match="reads IR versions \\[7\\]"):
        ir.require("primtorch", reads=(7,), writes=7)
