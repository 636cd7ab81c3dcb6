"""Weight-only quantization of a model's Linear layers: int8 per output channel, int4 per group.

`quantize_weights(model, "int8" | "int4")` swaps each nn.Linear for a module that holds its
weight quantized and dequantizes it in its forward, written the way users write it (a multiply by
the scales; for int4, shifts and masks that unpack two values from each byte). Eager, each call
builds the float weight and multiplies by it; compiled, inductor reads the quantized bytes and
dequantizes in registers inside the product's kernel (inductor/README.md, "Quantized weights").
Plain torch: no compiler import, no torch.ao.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

MODES = ("int8", "int4")
INT4_GROUP_SIZES = (32, 64, 128, 256)


class Int8WeightLinear(nn.Module):
    """A Linear whose weight is int8 with one scale per output channel (symmetric)."""

    def __init__(self, weight_int8: torch.Tensor, scale: torch.Tensor,
                 bias: Optional[torch.Tensor]):
        super().__init__()
        self.out_features, self.in_features = weight_int8.shape
        self.register_buffer("weight_int8", weight_int8)
        self.register_buffer("scale", scale)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int8WeightLinear":
        w = linear.weight.detach()
        # float32 for the rounding: a bf16 weight divided in bf16 would round twice
        scale = w.float().abs().amax(dim=1).clamp(min=1e-8) / 127
        q = torch.round(w.float() / scale[:, None]).clamp(-127, 127).to(torch.int8)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(q, scale.to(w.dtype), bias)

    def dequantized_weight(self) -> torch.Tensor:
        return self.weight_int8.to(self.scale.dtype) * self.scale[:, None]

    def forward(self, x):
        return F.linear(x, self.weight_int8.to(x.dtype) * self.scale[:, None], self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


class Int4WeightLinear(nn.Module):
    """A Linear whose weight is int4 in groups of `group_size` along the input dimension, with a
    scale and a zero point per group (asymmetric). Two values share a byte: column 2j in the low
    nibble, column 2j+1 in the high one; `weight_packed` is uint8 of shape (out, in / 2)."""

    def __init__(self, packed, scales, zeros, bias, group_size: int):
        super().__init__()
        self.out_features = packed.shape[0]
        self.in_features = packed.shape[1] * 2
        self.group_size = group_size
        self.register_buffer("weight_packed", packed)
        self.register_buffer("scales", scales)  # (out, in / group_size)
        self.register_buffer("zeros", zeros)  # same; integers 0..15 held in the float dtype
        # the shift of each nibble, broadcast over the packed bytes
        self.register_buffer("shifts", torch.tensor([0, 4], dtype=torch.uint8))
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int) -> "Int4WeightLinear":
        w = linear.weight.detach()
        n, k = w.shape
        g = w.float().reshape(n, k // group_size, group_size)
        lo = g.amin(dim=2).clamp(max=0)
        hi = g.amax(dim=2).clamp(min=0)
        scales = ((hi - lo) / 15).clamp(min=1e-8)
        zeros = torch.round(-lo / scales).clamp(0, 15)
        q = (torch.round(g / scales[..., None]) + zeros[..., None]).clamp(0, 15).to(torch.uint8)
        q = q.reshape(n, k // 2, 2)
        packed = q[..., 0] | (q[..., 1] << 4)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(packed.contiguous(), scales.to(w.dtype), zeros.to(w.dtype), bias, group_size)

    def _unpacked(self, dtype):
        n, k, g = self.out_features, self.in_features, self.group_size
        q = ((self.weight_packed.unsqueeze(-1) >> self.shifts) & 15).reshape(n, k // g, g)
        w = (q.to(dtype) - self.zeros.unsqueeze(-1).to(dtype)) * self.scales.unsqueeze(-1).to(dtype)
        return w.reshape(n, k)

    def dequantized_weight(self) -> torch.Tensor:
        return self._unpacked(self.scales.dtype)

    def forward(self, x):
        return F.linear(x, self._unpacked(x.dtype), self.bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"int4, group_size={self.group_size}")  # fmt: skip


QUANTIZED_LINEARS = (Int8WeightLinear, Int4WeightLinear)


def quantize_weights(model: nn.Module, mode: str = "int8", *, group_size: int = 128,
                     filter: Optional[Callable[[str, nn.Linear], bool]] = None) -> nn.Module:
    """Replace, in place, each nn.Linear of `model` (those `filter(name, linear)` accepts) by a
    weight-only quantized one: "int8" per output channel, or "int4" in groups of `group_size`
    input features. Returns `model`."""
    if mode not in MODES:
        raise ValueError(f"ember.quantize_weights: mode {mode!r} is not one of {MODES}")
    if mode == "int4" and group_size not in INT4_GROUP_SIZES:
        raise ValueError(f"ember.quantize_weights: int4 group_size {group_size} is not one of "
                         f"{INT4_GROUP_SIZES}")  # fmt: skip
    chosen = [(name, m) for name, m in model.named_modules()
              if type(m) is nn.Linear and (filter is None or filter(name, m))]  # fmt: skip
    for name, linear in chosen:
        if mode == "int8":
            new = Int8WeightLinear.from_linear(linear)
        else:
            if linear.in_features % group_size:
                raise ValueError(
                    f"ember.quantize_weights: {name or 'the model'} has {linear.in_features} input "
                    f"features, not a multiple of group_size={group_size}; pick another "
                    f"group_size or leave it out with filter=")  # fmt: skip
            new = Int4WeightLinear.from_linear(linear, group_size)
        new.to(linear.weight.device)
        _replace(model, name, new)
    return model


def dequantize_weights(model: nn.Module) -> nn.Module:
    """Replace, in place, each quantized Linear by an nn.Linear holding its dequantized weight:
    the float model whose results the quantized one should reproduce. Returns `model`."""
    chosen = [(n, m) for n, m in model.named_modules() if isinstance(m, QUANTIZED_LINEARS)]
    for name, q in chosen:
        w = q.dequantized_weight()
        linear = nn.Linear(q.in_features, q.out_features, bias=q.bias is not None,
                           device=w.device, dtype=w.dtype)  # fmt: skip
        with torch.no_grad():
            linear.weight.copy_(w)
            if q.bias is not None:
                linear.bias.copy_(q.bias)
        _replace(model, name, linear)
    return model


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    if not name:
        raise ValueError("ember.quantize_weights: the model itself is a Linear; wrap it in a "
                         "module")
    parent_name, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent_name), attr, new)


__all__ = ["Int4WeightLinear", "Int8WeightLinear", "dequantize_weights", "quantize_weights"]
