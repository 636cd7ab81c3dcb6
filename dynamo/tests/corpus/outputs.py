"""Structured inputs and outputs: dataclasses, namedtuples, dict subclasses (HuggingFace-style
ModelOutput), nested containers."""

import collections
import dataclasses
from typing import Optional

import torch

from . import case


def r(*shape):
    return torch.randn(*shape)


Pair = collections.namedtuple("Pair", ["a", "b"])


@dataclasses.dataclass
class Out:
    logits: torch.Tensor
    loss: Optional[torch.Tensor] = None
    extra: int = 0


class ModelOutput(collections.OrderedDict):
    """A minimal HuggingFace-style ModelOutput: a dataclass and an ordered dict at once."""

    def __getitem__(self, k):
        if isinstance(k, str):
            return dict(self.items())[k]
        return tuple(v for v in self.values() if v is not None)[k]

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None:
                self[f.name] = v


@dataclasses.dataclass
class CausalLMOutput(ModelOutput):
    logits: torch.Tensor = None
    hidden: Optional[torch.Tensor] = None


@case(lambda: (r(3),))
def return_namedtuple(x):
    return Pair(x + 1, x * 2)


@case(lambda: (Pair(r(3), r(3)),))
def namedtuple_input(p):
    return p.a + p.b, p[0] * 2


@case(lambda: (r(3),))
def namedtuple_methods(x):
    p = Pair(x, 2)
    return p._replace(b=3) if False else p.a * p.b


@case(lambda: (r(3),))
def return_dataclass(x):
    return Out(logits=x * 2, loss=x.sum())


@case(lambda: (r(3),))
def dataclass_defaults(x):
    o = Out(x)
    return o.logits + o.extra, o.loss is None


@case(lambda: (Out(r(3), r(())),))
def dataclass_input(o):
    return o.logits * o.loss


@case(lambda: (r(3),))
def return_model_output(x):
    return CausalLMOutput(logits=x * 2, hidden=x + 1)


@case(lambda: (r(3),))
def model_output_access(x):
    out = CausalLMOutput(logits=x * 2)
    return out.logits + out["logits"] + out[0], out.hidden is None


@case(lambda: (r(3),))
def model_output_to_tuple(x):
    out = CausalLMOutput(logits=x * 2, hidden=x)
    return out.to_tuple() if hasattr(out, "to_tuple") else tuple(out.values())


@case(lambda: (r(3),))
def return_dict(x):
    return {"out": x * 2, "aux": [x + 1, (x - 1, 3)]}


@case(lambda: ({"a": r(3), "b": r(3)},))
def dict_input(d):
    return d["a"] + d["b"]


@case(lambda: ([r(3), r(3), r(3)],))
def list_input(ts):
    return torch.stack(ts).sum(0), len(ts)


@case(lambda: ((r(3), (r(3), 2.0)),))
def nested_tuple_input(t):
    a, (b, k) = t
    return a * b * k


@case(lambda: (r(3),), graphs=0)
def return_input_itself(x):
    return x


@case(lambda: (r(3),))
def return_none(x):
    x.add_(1)


@case(lambda: (r(3), 3, "mode"))
def scalar_args(x, n, s):
    return x * n if s == "mode" else x


@case(lambda: (r(3), None), graphs=0)
def none_arg(x, y):
    return x if y is None else x + y


@case(lambda: (r(3), torch.float64))
def dtype_arg(x, dtype):
    return x.to(dtype)
