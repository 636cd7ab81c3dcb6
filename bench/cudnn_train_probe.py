"""What cuDNN's fused attention looks like in training on this GPU, to design its extern: the
forward's nine results (sizes, strides, dtypes, devices) with the log-sum-exp and dropout on, the
backward's, which backend torch picks for GPT-2-style calls, and fwd+bwd times of the cuDNN,
flash and memory-efficient kernels.

    python bench/cudnn_train_probe.py > $OUT/cudnn_probe.txt
"""

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

aten = torch.ops.aten


def describe(name, t):
    if isinstance(t, torch.Tensor):
        print(f"  {name}: {tuple(t.shape)} {t.stride()} {t.dtype} {t.device}")
    else:
        print(f"  {name}: {t!r}")


def timed(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main():
    print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.get_device_name())
    b, h, length, d = 8, 12, 512, 64
    q, k, v = (torch.randn(b, length, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
               .requires_grad_() for _ in range(3))  # fmt: skip
    mask = torch.ones(length, length, dtype=torch.bool, device="cuda").tril()
    for what, kw in (("causal, dropout 0.1", dict(is_causal=True, dropout_p=0.1)),
                     ("causal", dict(is_causal=True)),
                     ("bool mask, dropout 0.1", dict(attn_mask=mask, dropout_p=0.1)),
                     ("bool mask", dict(attn_mask=mask))):  # fmt: skip
        for cudnn in (True, False):
            torch.backends.cuda.enable_cudnn_sdp(cudnn)
            args = (q, k, v, kw.get("attn_mask"), kw.get("dropout_p", 0.0),
                    kw.get("is_causal", False))  # fmt: skip
            choice = SDPBackend(torch._fused_sdp_choice(*args))
            print(f"choice {what}, cudnn {cudnn}: {choice.name}")
    torch.backends.cuda.enable_cudnn_sdp(True)
    for dropout in (0.0, 0.1):
        print(f"forward, dropout {dropout}")
        res = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, dropout, True, False)
        names = ("out", "lse", "cum_q", "cum_k", "max_q", "max_k", "seed", "offset", "debug")
        for n, t in zip(names, res):
            describe(n, t)
        grad = torch.randn_like(res[0])
        g = aten._scaled_dot_product_cudnn_attention_backward(
            grad, q, k, v, res[0], res[1], res[6], res[7], None, res[2], res[3], res[4],
            res[5], dropout, True)  # fmt: skip
        print("backward")
        for n, t in zip(("dq", "dk", "dv"), g):
            describe(n, t)
        # the same seed and offset give the same output: the dropout is replayable
        again = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, dropout, True, False)
        print("  seed/offset advance:", res[6].item(), res[7].item(), again[6].item(),
              again[7].item())  # fmt: skip
    print(aten._scaled_dot_product_cudnn_attention_backward.default._schema)
    print(aten._scaled_dot_product_cudnn_attention.default._schema)
    go = torch.randn(b, h, length, d, device="cuda", dtype=torch.bfloat16)
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                    SDPBackend.EFFICIENT_ATTENTION):  # fmt: skip
        for dropout in (0.0, 0.1):
            def step():
                with sdpa_kernel([backend]):
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                         dropout_p=dropout)  # fmt: skip
                out.backward(go)
            try:
                print(f"{backend.name} dropout {dropout}: fwd+bwd {timed(step):.3f} ms")
            except RuntimeError as e:
                print(f"{backend.name} dropout {dropout}: {str(e)[:200]}")


if __name__ == "__main__":
    main()
