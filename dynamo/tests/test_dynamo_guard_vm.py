"""The C++ guard VM (csrc/eval_frame.cc) driven directly: loads, checks and failure indices."""

import torch

from ember.dynamo import source as S
from ember.dynamo._native import _C
from ember.dynamo.guards import GuardSet, tensor_spec


class Obj:
    def __init__(self):
        self.a = 3
        self.t = torch.ones(2, 3)


def _check(guards: GuardSet, args, g=None):
    prog = guards.compile()
    return prog.check(tuple(args), g if g is not None else {}, {})


def test_each_check_passes_and_fails():
    o = Obj()
    src = S.LocalSource("o", 0)
    gs = GuardSet()
    gs.add("TYPE", src, Obj)
    gs.add("EQ", S.AttrSource(src, "a"), 3)
    gs.add("TENSOR", S.AttrSource(src, "t"), tensor_spec(o.t))
    assert _check(gs, [None, o]) == -1
    o.a = 4
    assert _check(gs, [None, o]) >= 0
    o.a = 3
    o.t = torch.ones(3, 2)  # sizes
    assert _check(gs, [None, o]) >= 0
    o.t = torch.ones(2, 3, dtype=torch.float64)  # dtype
    assert _check(gs, [None, o]) >= 0
    o.t = torch.ones(3, 2).t()  # strides
    assert _check(gs, [None, o]) >= 0
    o.t = torch.ones(2, 3).requires_grad_()
    assert _check(gs, [None, o]) >= 0
    del o.a  # a failing load is a failing guard, never an error
    assert _check(gs, [None, o]) >= 0


def test_id_len_dict_keys_same_and_globals():
    lst, d = [1, 2], {"x": 1, "y": 2}
    gs = GuardSet()
    gs.add("ID", S.GlobalSource("torch"), torch)
    gs.add("LEN", S.LocalSource("l", 0), 2)
    gs.add("DICT_KEYS", S.LocalSource("d", 1), ("x", "y"))
    gs.add("SAME", S.ItemSource(S.LocalSource("l", 0), 0), S.ItemSource(S.LocalSource("l", 0), 0))
    assert _check(gs, [None, lst, d], {"torch": torch}) == -1
    assert _check(gs, [None, lst, d], {"torch": None}) >= 0
    assert _check(gs, [None, [1], d], {"torch": torch}) >= 0
    assert _check(gs, [None, lst, {"y": 2, "x": 1}], {"torch": torch}) >= 0  # key order


def test_param_guard_identity_and_metadata():
    lin = torch.nn.Linear(2, 2)
    src = S.ItemSource(S.AttrSource(S.LocalSource("m", 0), "_parameters"), "weight")
    gs = GuardSet()
    gs.add("PARAM", src, lin.weight)
    assert _check(gs, [None, lin]) == -1
    lin.weight.requires_grad_(False)
    assert _check(gs, [None, lin]) >= 0
    lin.weight.requires_grad_(True)
    assert _check(gs, [None, lin]) == -1
    # the same parameter, other sizes, strides or dtype in place: no longer what was traced
    for data in (torch.ones(3, 2), torch.ones(2, 2).t(), torch.ones(2, 2, dtype=torch.float64)):
        old, lin.weight.data = lin.weight.data, data
        assert _check(gs, [None, lin]) >= 0
        lin.weight.data = old
        assert _check(gs, [None, lin]) == -1
    lin.weight = torch.nn.Parameter(torch.ones(2, 2))
    assert _check(gs, [None, lin]) >= 0


def test_constant_source_and_cells():
    holder = {"k": 5}

    def outer():
        v = 7

        def inner():
            return v

        return inner

    fn = outer()
    gs = GuardSet()
    gs.add("EQ", S.ItemSource(S.ConstantSource(holder), "k"), 5)
    gs.add("EQ", S.CellSource(S.FnSource(), 0), 7)
    assert _check(gs, [fn]) == -1
    holder["k"] = 6
    assert _check(gs, [fn]) >= 0


def test_compiled_function_restores_callback():
    assert _C.get_callback() is None
    f = _C.CompiledFunction(lambda: _C.get_callback(), None)
    assert f() is None and _C.get_callback() is None
