"""Which matmul externs a compiled train-amp step of a bench model calls, with operand dtypes."""
import collections, sys, torch
sys.path[:0] = ["bench"]
import _paths  # noqa
import ember
from ember.inductor import lowering
from models import MODELS

name = sys.argv[1]
spec = MODELS[name]
torch.manual_seed(0)
model = spec.build().train()
inputs = spec.make_inputs(2, 64, torch.Generator().manual_seed(1))
seen = collections.Counter()
orig = lowering.Lowering.extern if hasattr(lowering, "Lowering") else None
cls = [c for c in vars(lowering).values() if isinstance(c, type) and hasattr(c, "extern")][0]
orig = cls.extern
def rec(self, name, fn, args, kwargs=None, meta=None):
    if name.startswith("extern.") and ("mm" in name):
        dts = tuple(str(getattr(a, "dtype", "-")).replace("torch.", "") for a in args if hasattr(a, "dtype"))
        out = meta if meta is not None else self.meta()
        seen[(name, dts, str(getattr(out, "dtype", out)).replace("torch.", ""),
              tuple(tuple(int(s) for s in a.sizes) for a in args if hasattr(a, "sizes")))] += 1
    return orig(self, name, fn, args, kwargs, meta)
cls.extern = rec
cm = ember.compile(model)
with torch.autocast("cpu", dtype=torch.bfloat16):
    out = cm(*inputs)
t = out[0] if isinstance(out, (tuple, list)) else getattr(out, "logits", out)
if not isinstance(t, torch.Tensor):
    t = next(v for v in (out.values() if hasattr(out, "values") else out) if isinstance(v, torch.Tensor))
t.float().mean().backward()
for k, v in sorted(seen.items()):
    print(v, k)
