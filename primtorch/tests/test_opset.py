"""The registered prim vocabulary equals the golden opset file of its opset version."""

from ember.ir import ops
from ember.primtorch import opset


def test_vocabulary_matches_golden_opset():
    problems = opset.diff_golden()
    assert not problems, (
        f"the prim vocabulary differs from {ops.GOLDEN_OPSET.name}:\n  "
        + "\n  ".join(problems)
        + "\nA released opset is frozen: bump ember.ir.ops.OPSET_VERSION (keeping the old golden "
        "readable) and write the new golden with `python -m ember.primtorch.opset --write`; "
        "before the first release, rewriting opset_v1.json is enough."
    )


def test_every_vocabulary_op_is_registered_by_primtorch():
    snapshot = opset.snapshot()
    assert snapshot["opset_version"] == ops.OPSET_VERSION
    names = set(snapshot["ops"])
    assert "prims.add" in names and "extern.mm" in names
    # control.* (cond, while_loop, map) are defined by ember.ir itself: dynamo writes them
    assert all(n.split(".")[0] in ("prims", "extern", "control") for n in names)
    assert {"control.cond", "control.while_loop", "control.map"} <= names
