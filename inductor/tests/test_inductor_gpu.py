"""The Triton path on a real GPU (skipped without CUDA): kernels compiled by Triton and autotuned."""

import gc
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ember.inductor import compile_fx, config, metrics
from inductor_helpers import check

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def cuda(*shape, dtype=torch.float32):
    return torch.randn(*shape, device="cuda", dtype=dtype)


def test_pointwise_softmax_layer_norm():
    check(lambda a, b: F.gelu(a * b + 1.0).tanh(), cuda(257, 129), cuda(129), kernels=1,
          atol=1e-5, rtol=1e-5)  # fmt: skip
    check(lambda a: torch.softmax(a, -1), cuda(64, 1000), kernels=1)
    check(lambda a: torch.softmax(a, -1), cuda(8, 5000), kernels=1)  # looped reduction
    x, w, b = cuda(32, 768), cuda(768), cuda(768)
    check(lambda x, w, b: F.layer_norm(x, (768,), w, b), x, w, b, kernels=1, atol=1e-4, rtol=1e-4)


def test_reductions_casts_and_indexing():
    x = cuda(33, 70)
    check(lambda a: (a.sum(0), a.amax(1), a.var(1), a.argmax(1)), x, atol=1e-4, rtol=1e-4)
    h = cuda(16, 300, dtype=torch.float16)
    check(lambda a: torch.softmax(a.float(), -1).half(), h, atol=1e-3, rtol=1e-2)
    check(lambda a, i: torch.gather(a, 1, i), x, torch.randint(0, 70, (33, 5), device="cuda"))
    check(lambda a, b: torch.cat([a, b], 0), x, cuda(3, 70))


def test_mlp_training_step():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 8)
    ).cuda()
    x = cuda(32, 64)
    compiled = compile_fx(model, [x])
    out = compiled(x)
    torch.testing.assert_close(out, model(x), atol=1e-4, rtol=1e-4)
    grads = torch.autograd.grad(out.square().mean(), list(model.parameters()))
    ref = torch.autograd.grad(model(x).square().mean(), list(model.parameters()))
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4)
    assert metrics.generated_kernel_count >= 2 and config.autotune


def deep_mlp(width, depth):
    """Enough kernels and matmuls for a program to be replayed from a CUDA graph."""
    layers = [nn.Linear(64, width)]
    for _ in range(depth):
        layers += [nn.GELU(), nn.LayerNorm(width), nn.Linear(width, width)]
    return nn.Sequential(*layers).cuda().eval()


def _run_inference(model, xs):
    """Compile `model`, call it on each input without grad (checking each result against
    eager), and return the CUDA-graph replay count with every (input, output) pair."""
    compiled = compile_fx(model, [xs[0]])
    metrics.reset()
    outs = []
    with torch.no_grad():
        for x in xs:
            out = compiled(x)
            torch.testing.assert_close(out, model(x), atol=1e-4, rtol=1e-4)
            outs.append((x, out))
    return metrics.cudagraph_replays, outs


def test_inference_replays_a_cuda_graph():
    torch.manual_seed(0)
    first = cuda(32, 64)
    xs = [first, first] + [cuda(32, 64) for _ in range(4)]  # fixed at first, then moving
    model = deep_mlp(128, 6)
    replays, outs = _run_inference(model, xs)
    assert replays >= 3
    for x, out in outs:  # each call's result is its own: later replays did not overwrite it
        torch.testing.assert_close(out, model(x), atol=1e-4, rtol=1e-4)


def test_captures_leave_no_memory_behind():
    """Programs captured one after another, each dropped once called: what stays allocated
    does not grow with the number of captures (a new warm-up stream per capture kept a cuBLAS
    workspace of 32 MiB alive for each)."""
    x = cuda(32, 64)

    def capture_one():
        replays, _ = _run_inference(deep_mlp(128, 6), [x] * 4)
        assert replays >= 1
        gc.collect()
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()

    after_first = capture_one()
    after_all = [capture_one() for _ in range(4)][-1]
    assert after_all - after_first < 4 * 2**20, (after_first, after_all)


def test_a_small_program_is_not_graphed():
    model = nn.Sequential(nn.Linear(64, 8), nn.ReLU()).cuda().eval()
    x = cuda(4, 64)
    assert _run_inference(model, [x] * 5)[0] == 0


def test_cuda_graph_follows_an_input_that_was_fixed():
    """The first calls pass one tensor (as a benchmark does); later calls pass others."""
    x = cuda(4, 64)
    replays, _ = _run_inference(deep_mlp(32, 6), [x] * 4 + [cuda(4, 64) for _ in range(3)])
    assert replays >= 4


def test_training_graphs_are_not_graphed():
    model = deep_mlp(32, 6).train()
    x = cuda(4, 64)
    compiled = compile_fx(model, [x])
    metrics.reset()
    for _ in range(4):
        out = compiled(x)
        out.sum().backward()
    assert metrics.cudagraph_replays == 0


def test_a_cpu_scalar_read_by_cuda_kernels():
    # Eager lets a CUDA op read a 0-dim CPU tensor; a Triton kernel reads a copy on the GPU, and
    # work whose result is on the CPU runs there.
    check(lambda x, s: (x * s + 1, (s * 2).exp()), cuda(64, 33), torch.tensor(1.5))


class DrawsOnTheCpu(nn.Module):
    """BART's LayerDrop: `torch.rand([])` on the CPU in the middle of a CUDA model."""

    def __init__(self):
        super().__init__()
        self.mlp = deep_mlp(32, 6)

    def forward(self, x):
        p = torch.rand([])
        return self.mlp(x) * (p >= 0).to(x.dtype), p


def test_cpu_random_draws_in_a_cuda_training_step():
    torch.manual_seed(0)
    model = DrawsOnTheCpu().train()
    x = cuda(8, 64)
    compiled = compile_fx(model, [x])
    out, p = compiled(x)
    assert p.device.type == "cpu" and 0 <= float(p) < 1
    ref, _ = model(x)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    grads = torch.autograd.grad(out.square().mean(), list(model.parameters()))
    refs = torch.autograd.grad(ref.square().mean(), list(model.parameters()))
    for g, r in zip(grads, refs):
        torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4)


def test_a_program_with_cpu_work_is_not_graphed():
    model = DrawsOnTheCpu().eval()
    x = cuda(8, 64)
    compiled = compile_fx(model, [x])
    metrics.reset()
    with torch.no_grad():
        draws = {float(compiled(x)[1]) for _ in range(6)}
    assert metrics.cudagraph_replays == 0 and len(draws) > 1  # each call draws afresh


_NEW_PROCESS = r"""
import json, torch, torch.nn as nn, triton.runtime.jit as jit
from ember.inductor import compile_fx, metrics
jitted = []
do_compile = jit.JITFunction._do_compile
def counting(self, *args, **kwargs):
    jitted.append(1)
    return do_compile(self, *args, **kwargs)
jit.JITFunction._do_compile = counting
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.LayerNorm(96), nn.Softmax(-1)).cuda().eval()
x = torch.randn(40, 64, device="cuda")
with torch.no_grad():
    compiled = compile_fx(torch.fx.symbolic_trace(model), [x])
    torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
from ember.inductor import triton_binaries
print(json.dumps({"loaded": metrics.triton_binaries_loaded, "jit": len(jitted),
                  "own_handles": triton_binaries._handles_supported(),
                  "launchers": len(triton_binaries._LAUNCHERS)}))
"""


def _in_new_process(cache) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), EMBER_CACHE_DIR=str(cache))
    run = subprocess.run([sys.executable, "-c", _NEW_PROCESS], env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_new_process_launches_the_stored_triton_binaries(tmp_path):
    """A warm start loads each kernel's cubin from Ember's cache: no call of Triton's JIT (whose
    cache lookup alone hashes Triton's installation). A damaged cubin is not trusted: the JIT
    compiles the kernels again, and the results still match."""
    cold = _in_new_process(tmp_path)
    assert cold["jit"] > 0, cold
    warm = _in_new_process(tmp_path)
    assert warm["loaded"] > 0 and warm["jit"] == 0, warm
    if warm["own_handles"]:  # loaded without CompiledKernel: launchers shared by signature
        assert 0 < warm["launchers"] <= warm["loaded"], warm
    cubins = list(tmp_path.rglob("triton_bin/*/*/kernel.cubin"))
    assert cubins
    for cubin in cubins:
        cubin.write_bytes(b"not a cubin")
    damaged = _in_new_process(tmp_path)  # (its results are checked in the process)
    assert damaged["jit"] > 0, damaged
    assert all(c.read_bytes() != b"not a cubin" for c in cubins)  # compiled and stored again


# --- inference attention on cuDNN's kernel where torch would run it ------------------------------


def _attention_case(kind, length=256):
    """(fn, args) of a bf16 inference attention: an additive float mask, a boolean sliding
    window, causal, or no mask."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 8, length, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(3))  # fmt: skip
    i = torch.arange(length, device="cuda")
    window = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < 64)  # no row fully masked
    if kind == "float":
        mask = torch.zeros(2, 1, length, length, device="cuda", dtype=torch.bfloat16)
        mask = mask.masked_fill(~window, float("-inf")) + 0.1 * torch.randn(
            mask.shape, device="cuda", dtype=torch.bfloat16, generator=gen)
        return (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)), (
            q, k, v, mask)
    if kind == "sliding_bool":
        return (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)), (
            q, k, v, window[None, None].expand(2, 1, length, length))
    if kind == "causal":
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)), (q, k, v)
    return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v)), (q, k, v)


@pytest.mark.parametrize("kind", ["float", "sliding_bool", "causal", "none"])
def test_inference_attention_runs_on_cudnn_where_torch_would(kind):
    from torch.nn.attention import SDPBackend

    from ember.inductor import compile_prims
    from ember.primtorch import prims
    from ember.primtorch.attention import torch_choice
    from ember.primtorch.trace import trace_to_prims

    fn, args = _attention_case(kind)
    mask = args[3] if len(args) == 4 else None
    torch_picks = torch_choice(*args[:3], mask, 0.0, kind == "causal", None, False, cudnn=True)
    with torch.no_grad():
        gm = trace_to_prims(fn, *args)
        compiled = compile_prims(gm, list(args))
        got, want = compiled(*args), fn(*args)
    got = got[0] if isinstance(got, (tuple, list)) else got
    calls = [n for n in gm.graph.nodes if n.target is prims.extern.sdpa_cudnn]
    print(f"{kind}: torch picks {torch_picks.name}; Ember records {len(calls)} sdpa_cudnn")
    assert len(calls) == (torch_picks == SDPBackend.CUDNN_ATTENTION), gm.code
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    assert got.stride() == args[0].stride()  # the declared layout: the query's


def test_inference_attention_stays_off_cudnn_when_the_user_turned_it_off():
    from ember.primtorch import prims
    from ember.primtorch.trace import trace_to_prims

    fn, args = _attention_case("sliding_bool")
    was = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(False)
        with torch.no_grad():
            gm = trace_to_prims(fn, *args)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)
    assert not [n for n in gm.graph.nodes if n.target is prims.extern.sdpa_cudnn]
    assert torch.backends.cuda.cudnn_sdp_enabled() == was


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transposing_kernels_run_in_tiles(dtype):
    """A gate reading a token-mixed value transposed (gMLP) and an NCHW-to-NHWC copy render as
    [XBLOCK, YBLOCK] tiles on a 2-D grid; every autotuned tile shape compiles and matches."""
    tol = dict(atol=1e-2, rtol=1e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    u, v = cuda(8, 196, 768, dtype=dtype), cuda(8, 768, 196, dtype=dtype)
    check(lambda u, v: u * v.transpose(1, 2), u, v, kernels=1, **tol)
    x = cuda(32, 64, 28, 28, dtype=dtype)
    check(lambda x: x.contiguous(memory_format=torch.channels_last) * 2, x, kernels=1, **tol)


def test_tiled_kernels_in_the_cpp_wrapper():
    import ember

    fn = lambda u, v: (u * v.transpose(1, 2)).relu()  # noqa: E731
    u, v = cuda(4, 96, 160), cuda(4, 160, 96)
    got = ember.compile(fn, options={"cpp_wrapper": True})(u, v)
    torch.testing.assert_close(got, fn(u, v))
