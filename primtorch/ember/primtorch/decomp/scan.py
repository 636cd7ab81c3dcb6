"""cumsum as a masked reduction, for targets with no scan kernel (the C++ runtime).

out[..., i] = sum over j <= i of x[..., j]: a where() over a lower-triangular (i, j) mask summed
along j, which fuses into one reduction kernel without materialising the n x n expansion. It does
n^2 / 2 more work than a scan, which suits the short rows models scan (position ids over a
sequence); summation order differs from ATen's sequential one, as any parallel scan's does.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def cumsum_as_reduction(self, dim, *, dtype=None):
    if dtype is None and (self.dtype == torch.bool or not self.dtype.is_floating_point
                          and not self.dtype.is_complex):  # fmt: skip
        dtype = torch.int64  # ATen's promotion of integral scans
    x = self.to(dtype) if dtype is not None else self
    if self.ndim == 0:
        return x.clone()
    dim = dim % self.ndim
    x = x.movedim(dim, -1)
    n = x.shape[-1]
    idx = torch.arange(n, device=x.device)
    keep = idx.view(1, n) <= idx.view(n, 1)  # keep[i, j]: j <= i
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    out = torch.where(keep, x.unsqueeze(-2), zero).sum(-1, dtype=x.dtype)
    return out.movedim(-1, dim).contiguous()


EXTERN_DECOMPOSITIONS = {aten.cumsum.default: cumsum_as_reduction}
