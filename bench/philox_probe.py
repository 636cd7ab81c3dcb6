"""What the CUDA attention kernels return for their dropout RNG state (device, dtype, shape), in
training with dropout and without: the shapes extern metas must declare.

    python bench/philox_probe.py
"""

import torch

aten = torch.ops.aten


def describe(t):
    return f"{tuple(t.shape)} {t.dtype} {t.device}" if isinstance(t, torch.Tensor) else repr(t)


def main():
    q = torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for p in (0.0, 0.1):
        eff = aten._scaled_dot_product_efficient_attention(q, q, q, None, True, p, False)
        print(f"efficient p={p}:", [describe(t) for t in eff])
        fl = aten._scaled_dot_product_flash_attention(q, q, q, p, False)
        print(f"flash p={p}:", [describe(t) for t in fl])


if __name__ == "__main__":
    main()
