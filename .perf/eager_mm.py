import collections, sys, torch
sys.path[:0] = ["bench"]
import _paths  # noqa
from torch.utils._python_dispatch import TorchDispatchMode
from models import MODELS
spec = MODELS[sys.argv[1]]
torch.manual_seed(0)
model = spec.build().train()
inputs = spec.make_inputs(2, 64, torch.Generator().manual_seed(1))
seen = collections.Counter()
class M(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "mm" in str(func) or "matmul" in str(func):
            seen[(str(func), tuple(str(a.dtype) for a in args if isinstance(a, torch.Tensor)), tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor)))] += 1
        return func(*args, **(kwargs or {}))
with M():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(*inputs)
    t = out[0] if isinstance(out, (tuple, list)) else getattr(out, "logits", out)
    t.float().mean().backward()
for k, v in sorted(seen.items()): print(v, k)
