"""Sources as dict keys: chained sources hash once, and equal chains stay interchangeable."""

import dataclasses
import pickle

from ember.dynamo.source import AttrSource, CellSource, FnSource, ItemSource, LocalSource


def _param(block: int, name: str):
    mod = AttrSource(AttrSource(LocalSource("self", 0), "blocks"), "_modules")
    return ItemSource(AttrSource(ItemSource(mod, str(block)), "_parameters"), name)


def test_equal_chains_are_one_key_and_different_ones_are_not():
    keys = {_param(b, n): (b, n) for b in range(20) for n in ("weight", "bias")}
    assert len(keys) == 40
    for b in range(20):
        for n in ("weight", "bias"):
            assert keys[_param(b, n)] == (b, n)  # a fresh, equal chain finds the entry
    assert _param(1, "weight") != _param(1, "bias")
    assert AttrSource(LocalSource("x", 0), "a") != ItemSource(LocalSource("x", 0), "a")
    assert CellSource(FnSource(), 0) == CellSource(FnSource(), 0)
    assert hash(CellSource(FnSource(), 0)) == hash(CellSource(FnSource(), 0))


def test_the_hash_is_remembered_and_follows_the_fields():
    s = _param(3, "weight")
    h = hash(s)
    assert s.__dict__["_hash"] == h and hash(s) == h
    other = dataclasses.replace(s, key="bias")  # a new object: its own hash
    assert "_hash" not in other.__dict__ and other != s and hash(other) == hash(_param(3, "bias"))


def test_a_pickled_source_does_not_carry_this_process_hash():
    s = _param(3, "weight")
    hash(s)
    back = pickle.loads(pickle.dumps(s))
    assert back == s and "_hash" not in back.__dict__ and hash(back) == hash(s)


def test_inputs_are_placeholders_in_order_of_first_read_before_every_op():
    import torch

    import ember

    layers = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(12)])

    def fn(x):
        y = x.sin()
        for layer in layers:
            y = layer(y).relu()
        return y + x

    x = torch.randn(2, 4)
    out = ember.explain(fn)(x)
    (gm,) = out.graphs
    ops = [n.op for n in gm.graph.nodes]
    n_inputs = ops.count("placeholder")
    assert n_inputs == 1 + 2 * 12 and ops[:n_inputs] == ["placeholder"] * n_inputs
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    assert names[0] == "l_x" and "weight" in names[1] and "bias" in names[2], names[:3]
    assert "11" in names[-1] and "bias" in names[-1], names[-1]
    torch.testing.assert_close(ember.compile(fn, backend="eager")(x), fn(x))


def test_graph_inputs_read_each_branch_of_their_sources_once():
    """The transformed function reads a prefix that several inputs share once, into a temporary
    (a module's parameters share `self.blocks._modules[i]._parameters`), and evaluates to the
    same objects as the full chains."""
    from ember.dynamo.codegen import CodeGen

    class Holder:
        pass

    this = Holder()
    this.blocks = Holder()
    this.blocks._modules = {str(b): Holder() for b in range(3)}
    for b, block in this.blocks._modules.items():
        block._parameters = {"weight": f"w{b}", "bias": f"b{b}"}
    sources = [_param(b, n) for b in range(3) for n in ("weight", "bias")]
    sources.append(AttrSource(LocalSource("self", 0), "blocks"))  # an input others read further
    cg = CodeGen(output=None, arg_names=["self"])
    exprs = cg.input_exprs(sources)
    body = cg.lines + [f"return [{', '.join(exprs)}]"]
    text = "def f(self):\n" + "\n".join("    " + line for line in body)
    assert text.count("_modules") == 1 and text.count("._parameters") == 3, text
    assert text.count(".blocks") == 1, text
    namespace: dict = {}
    exec(text, namespace)
    expected = [eval(s.expr(), {"self": this}) for s in sources]  # noqa: S307
    assert namespace["f"](this) == expected
