"""Interop: Ember's frame hook and torch's own compiler in one process.

Both keep per-code state in CPython's code-object extras; CPython calls each registered free
function for every extras slot of a dying code object, set or not, so each hook must accept a
null slot. A crash here happens in the garbage collector, hence the subprocess.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).absolute().parents[2]

SCRIPT = textwrap.dedent(
    """
    import gc, sys, torch
    sys.path[:0] = [str(p) for p in {paths!r}]
    import ember

    f = ember.compile(lambda x: x.sin() + 1, backend="eager")
    x = torch.randn(3)
    assert torch.equal(f(x), x.sin() + 1)
    g = torch.compile(lambda x: x.cos() * 2, backend="eager")
    assert torch.equal(g(x), x.cos() * 2)
    del f, g
    gc.collect()
    assert torch.equal(ember.compile(lambda x: x.exp(), backend="eager")(x), x.exp())
    print("ok")
    """
)


def test_ember_and_torch_compile_in_one_process():
    paths = [ROOT / c for c in ("ir", "primtorch", "aot_autograd", "dynamo", "inductor")]
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(paths=[str(p) for p in paths])],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
