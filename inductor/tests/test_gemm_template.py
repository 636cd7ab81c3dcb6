"""max-autotune's matmul templates, run through Triton's interpreter with the choice forced (the
real render path, no timing), and the autotuner's subprocess and cache on the CPU."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere in this process

import pytest
import torch
import torch.nn.functional as F
from ember.inductor import compile_fx, config, metrics
from ember.inductor import autotune
from ember.inductor.gemm_template import GemmKernel, gemm_configs, as_gemm
from ember.ir import toolchain
from inductor_helpers import check


@pytest.fixture(autouse=True)
def forced_template(monkeypatch):
    monkeypatch.setattr(config, "cpu_backend", "triton")
    monkeypatch.setattr(config, "max_autotune_gemm", True)
    monkeypatch.setattr(config, "gemm_force", 0)


def mats(*shapes, dtype=torch.float32):
    return [torch.randn(*s, dtype=dtype) for s in shapes]


def test_mm_bias_gelu_is_one_kernel():
    a, w, b = mats((32, 40), (40, 48), (48,))
    c = check(lambda a, w, b: F.gelu(a @ w + b), a, w, b, kernels=1, atol=1e-5, rtol=1e-5)
    assert metrics.gemm_templates == 1
    assert "tl.dot(" in c.source and "tl.erf(" in c.source and "mm(" not in c.source


def test_sizes_the_blocks_divide_have_no_masks_or_wraps():
    """32 x 64 products in 32 x 64 tiles: no edge, so no mask and no modulo (which would hide
    the contiguous runs from Triton); a 0-d epilogue input is read as a scalar."""
    a, w, b, s = *mats((32, 64), (64, 64), (64,)), torch.tensor(3.0)
    c = check(lambda a, w, b, s: F.gelu(a @ w + b) * s, a, w, b, s, kernels=1, atol=1e-4,
              rtol=1e-5)  # fmt: skip
    src = c.program.kernels[0].source
    assert "mask" not in src, src
    assert "ra = rm\n" in c.source and "rb = rn\n" in c.source


def test_linear_relu_addmm_with_transposed_weight():
    x, w, b = mats((33, 40), (24, 40), (24,))  # non-multiples of the blocks
    c = check(lambda x, w, b: F.relu(F.linear(x, w, b)), x, w, b, kernels=1, atol=1e-5, rtol=1e-5)
    assert metrics.gemm_templates == 1 and "extern_" not in c.source


def test_bmm_with_a_residual_add_epilogue():
    a, b, r = mats((3, 17, 40), (3, 40, 20), (3, 17, 20))
    check(lambda a, b, r: torch.bmm(a, b) + r, a, b, r, kernels=1, atol=1e-5, rtol=1e-5)
    assert metrics.gemm_templates == 1


def test_baddbmm_alpha_beta_and_a_batch_broadcast_weight():
    x, a, w = mats((4, 1, 20), (4, 16, 24), (24, 20))
    fn = lambda x, a, w: torch.baddbmm(x, a, w.expand(4, 24, 20), beta=0.5, alpha=2.0)  # noqa: E731
    check(fn, x, a, w, atol=1e-5, rtol=1e-5)
    assert metrics.gemm_templates == 1
    nan = torch.full((4, 16, 20), float("nan"))  # beta=0: torch ignores the bias, NaNs too
    check(lambda x, a, w: torch.baddbmm(x, a, w.expand(4, 24, 20), beta=0), nan, a, w,
          atol=1e-5, rtol=1e-5)  # fmt: skip
    assert metrics.gemm_templates == 1


def test_bf16_product_then_cast_and_scale():
    a, w, b = mats((32, 40), (40, 48), (48,), dtype=torch.bfloat16)
    check(lambda a, w, b: ((a @ w) * 2 + b).float(), a, w, b, kernels=1, atol=5e-2, rtol=2e-2)
    assert metrics.gemm_templates == 1


def test_operand_casts_are_read_through_as_a_prologue():
    """Under autocast a float32 weight (transposed) and input are cast to bfloat16 for the
    product: the template reads the float32 tensors and casts each block, so the casts' own
    kernels are gone; a cast something else reads too keeps its kernel."""
    x, w, b = mats((32, 40), (48, 40), (48,))

    def linear(x, w, b):
        bf = torch.bfloat16
        return F.gelu(x.to(bf) @ w.to(bf).t() + b.to(bf))

    c = check(linear, x, w, b, kernels=1, atol=5e-2, rtol=2e-2)
    assert metrics.gemm_templates == 1 and c.source.count(".to(tl.bfloat16)") >= 1
    both = lambda x, w: (x @ w.to(torch.bfloat16).t(), w.to(torch.bfloat16) * 2)  # noqa: E731
    check(both, x.to(torch.bfloat16), w, kernels=2, atol=5e-2, rtol=2e-2)
    assert metrics.gemm_templates == 1
    sq = torch.randn(24, 24)  # one cast as both operands: both read through, its kernel gone
    check(lambda s: s.to(torch.bfloat16) @ s.to(torch.bfloat16), sq, kernels=1, atol=5e-2,
          rtol=2e-2)  # fmt: skip
    # x @ x.T: the transposed operand is a view of the cast, which therefore stays
    check(lambda s: (lambda c: c @ c.t())(s.to(torch.bfloat16)), sq, atol=5e-2, rtol=2e-2)


def test_product_read_elsewhere_is_stored_too():
    """A product that is an output as well as the epilogue's input is written by the template;
    one only a reduction reads keeps its epilogue-free template and the reduction kernel."""
    a, w = mats((32, 40), (40, 48))
    c = check(lambda a, w: ((a @ w), (a @ w).sigmoid()), a, w, kernels=1, atol=1e-5, rtol=1e-5)
    assert c.source.count("tl.store(") == 2
    check(lambda a, w: (a @ w).softmax(-1), a, w, kernels=2, atol=1e-5, rtol=1e-5)
    assert metrics.gemm_templates == 1
    w2 = torch.randn(40, 48)  # two products read by one kernel: one takes it as its epilogue
    check(lambda a, w, v: torch.relu(a @ w + a @ v), a, w, w2, kernels=2, atol=1e-5, rtol=1e-5)
    assert metrics.gemm_templates == 2


def test_every_config_renders_and_runs():
    a, w = mats((20, 24), (24, 36))
    g = None
    for i in range(len(_configs_for(20, 36, 24))):
        config.gemm_force = i
        c = check(lambda a, w: torch.tanh(a @ w), a, w, kernels=1, atol=1e-5, rtol=1e-5)
        g = g or c
    assert metrics.gemm_templates == 1


def _configs_for(m, n, k):
    from ember.inductor.gemm_template import Gemm
    from ember.inductor.loop_ir import ExternBuffer, Layout

    lay = Layout(torch.float32, "cpu", (m, n), (n, 1))
    return gemm_configs(Gemm(ExternBuffer("p", lay), None, None, None, 1, 1, 0, m, n, k))


def test_default_mode_and_unforced_cpu_keep_the_library_call(monkeypatch):
    a, w = mats((32, 40), (40, 48))
    monkeypatch.setattr(config, "max_autotune_gemm", False)
    c = check(lambda a, w: (a @ w).relu(), a, w, kernels=1)
    assert "extern_mm" in c.source and metrics.gemm_templates == 0
    monkeypatch.setattr(config, "max_autotune_gemm", True)
    monkeypatch.setattr(config, "gemm_force", None)  # no GPU to time on: the call stays
    c = check(lambda a, w: (a @ w).relu(), a, w, kernels=1)
    assert "extern_mm" in c.source and metrics.gemm_templates == 0


def test_symbolic_sizes_keep_the_library_call():
    """A template is compiled for static sizes only: rows that vary keep the library call."""
    from inductor_helpers import dynamic_gm

    model = torch.nn.Sequential(torch.nn.Linear(40, 24), torch.nn.ReLU())
    x = torch.randn(16, 40)
    gm = dynamic_gm(model, [x], [{0: "s0"}])
    with torch.no_grad():
        compiled = compile_fx(gm, [x], mode="max-autotune")
        for n in (16, 9):
            xs = torch.randn(n, 40)
            torch.testing.assert_close(compiled(xs), model(xs), atol=1e-5, rtol=1e-5)
    assert metrics.gemm_templates == 0


def test_compile_fx_max_autotune_turns_templates_on(monkeypatch):
    monkeypatch.setattr(config, "max_autotune_gemm", False)
    model = torch.nn.Sequential(torch.nn.Linear(40, 24), torch.nn.GELU())
    x = torch.randn(16, 40)
    with torch.no_grad():
        out = compile_fx(model, [x], mode="max-autotune")(x)
        torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
        assert metrics.gemm_templates == 1 and config.max_autotune_gemm is False
        compile_fx(model, [x])(x)
    assert metrics.gemm_templates == 1  # the default mode made none


def test_training_step_with_templates_in_both_directions():
    """Forward and backward matmuls (the backward's read transposed views) as templates."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 64), torch.nn.GELU(), torch.nn.Linear(64, 24))
    x = torch.randn(32, 40)
    out = compile_fx(model, [x], mode="max-autotune")(x)
    grads = torch.autograd.grad(out.square().mean(), list(model.parameters()))
    ref = torch.autograd.grad(model(x).square().mean(), list(model.parameters()))
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4)
    assert metrics.gemm_templates >= 5  # 2 forward, 3 backward (no grad for x)


def test_the_template_compiles_for_hopper(monkeypatch):
    """The GPU spelling of the template (no interpreter work-arounds), its largest and smallest
    configs, compiled by the real Triton compiler for sm_90 (no GPU needed)."""
    from ember.inductor import codegen_triton, compile_prims, gemm_template
    from ember.inductor.triton_aot import check_kernels
    from ember.primtorch.trace import trace_to_prims

    for module in (gemm_template, codegen_triton):
        monkeypatch.setattr(module, "_interpreting", lambda: False)
    a, w, b = mats((256, 128), (128, 256), (256,), dtype=torch.bfloat16)
    w = w.float()  # and a prologue: the weight cast in the template
    fn = lambda a, w, b: F.relu(a @ w.to(torch.bfloat16) + b)  # noqa: E731
    kernels = []
    for force in (0, 99):  # 99: the last config
        monkeypatch.setattr(config, "gemm_force", force)
        (k,) = compile_prims(trace_to_prims(fn, a, w, b), [a, w, b]).program.kernels
        assert "tl.dot(a, b, acc)" in k.source and "a = tl.load(a_ptrs)\n" in k.source
        assert "b = tl.load(b_ptrs).to(tl.bfloat16)\n" in k.source
        kernels.append((k.name, k))
    assert [dict(k.meta)["configs"][0]["num_stages"] for _, k in kernels] == [3, 5]
    # float32 (eager's ieee products), and a float16 bmm with edges and a residual's tanh
    monkeypatch.setattr(config, "gemm_force", 0)
    x, wt, bias = mats((100, 72), (40, 72), (40,))
    p, q, r = mats((3, 40, 24), (3, 24, 36), (3, 40, 36), dtype=torch.float16)
    for fn, args in (
        (lambda x, w, b: F.linear(x, w, b).sigmoid(), (x, wt, bias)),
        (lambda p, q, r: torch.tanh(torch.bmm(p, q) + r), (p, q, r)),
    ):
        (k,) = compile_prims(trace_to_prims(fn, *args), list(args)).program.kernels
        kernels.append((k.name, k))
    assert 'input_precision="ieee"' in kernels[2][1].source
    assert "mask = " in kernels[3][1].source and "bidx" in kernels[3][1].source
    assert check_kernels(kernels, 90) == []


def test_as_gemm_declines_what_it_cannot_compute():
    from ember.inductor.loop_ir import ExternBuffer, InputBuffer, Layout

    def buf(name, sizes, dtype=torch.float32):
        strides = (sizes[1], 1) if len(sizes) == 2 else (1,)
        return InputBuffer(name, Layout(dtype, "cpu", sizes, strides))

    out = Layout(torch.float32, "cpu", (4, 4), (4, 1))
    ok = ExternBuffer("p", out, op="extern.mm", args=(buf("a", (4, 8)), buf("b", (8, 4))))
    assert as_gemm(ok) is not None
    ints = ExternBuffer("p", Layout(torch.int64, "cpu", (4, 4), (4, 1)), op="extern.mm",
                        args=(buf("a", (4, 8), torch.int64), buf("b", (8, 4), torch.int64)))
    conv = ExternBuffer("p", out, op="extern.convolution", args=())
    assert as_gemm(ints) is None and as_gemm(conv) is None
    assert not isinstance(ok, GemmKernel)


def test_measured_choice_through_the_pipeline_is_cached(tmp_path, monkeypatch):
    """The measured path end to end on the CPU (Triton's interpreter times the templates in the
    worker, torch the library call plus the epilogue kernel): a graph's two matmuls are timed
    by one worker, and a second compile of the graph reads both choices instead."""
    monkeypatch.setattr(toolchain.config, "cache_dir", tmp_path)
    monkeypatch.setattr(config, "gemm_force", "measure")
    workers = []
    run_worker = autotune._run_worker
    monkeypatch.setattr(autotune, "_run_worker", lambda *a: workers.append(1) or run_worker(*a))
    a, w, b, v = mats((32, 40), (40, 48), (48,), (48, 16))
    fn = lambda a, w, b, v: torch.sigmoid(a @ w + b) @ v  # noqa: E731
    check(fn, a, w, b, v, atol=1e-5, rtol=1e-5)
    assert metrics.gemm_autotune_runs == 2 and metrics.gemm_autotune_hits == 0
    assert len(workers) == 1
    check(fn, a, w, b, v, atol=1e-5, rtol=1e-5)  # (check resets the counters)
    assert metrics.gemm_autotune_runs == 0 and metrics.gemm_autotune_hits == 2
    assert len(workers) == 1


# --- the autotuner's subprocess and cache (timed on the CPU) -------------------------------------

CRASH = """
import ctypes
ctypes.string_at(0)  # a segmentation fault in the worker, as a broken kernel can cause
"""
RAISE = """
import triton

@triton.jit
def k(x, xnumel, XBLOCK: tl.constexpr):
    pass
"""  # `tl` is undefined: the kernel fails to compile


def _choices():
    spec = {"dtype": "float32", "sizes": [64, 64], "strides": [64, 1], "offset": 0,
            "storage": 4096}  # fmt: skip
    tensors = {"a": spec, "b": spec}
    mm = {"kind": "extern", "op": "extern.mm", "args": [{"tensor": "a"}, {"tensor": "b"}]}
    crash = {"kind": "triton", "source": CRASH, "name": "k", "args": ["a"], "sizes": [1],
             "cfgs": [{"XBLOCK": 1, "num_warps": 1}]}  # fmt: skip
    broken = dict(crash, source=RAISE)
    choices = [autotune.Choice("crash", [crash]), autotune.Choice("extern", [mm]),
               autotune.Choice("broken", [broken])]  # fmt: skip
    return choices, tensors


def test_a_crashing_candidate_is_dropped_and_the_choice_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(toolchain.config, "cache_dir", tmp_path)
    choices, tensors = _choices()
    best, times = autotune.pick(choices, tensors, "cpu")
    assert best == 1 and times["crash"] is None and times["broken"] is None
    assert times["extern"] > 0 and metrics.gemm_autotune_runs == 1
    again, _ = autotune.pick(choices, tensors, "cpu")  # a warm start: no worker
    assert again == 1 and metrics.gemm_autotune_runs == 1 and metrics.gemm_autotune_hits == 1
    job = {"device": "cpu", "tensors": tensors, "choices": [c.__dict__ for c in choices]}
    other = dict(job, tensors={**tensors, "a": dict(tensors["a"], strides=[1, 64])})
    assert autotune.job_key(job) != autotune.job_key(other)  # another layout: timed afresh


def test_no_candidate_that_runs_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(toolchain.config, "cache_dir", tmp_path)
    choices, tensors = _choices()
    with pytest.raises(RuntimeError, match="no candidate ran"):
        autotune.pick([choices[2]], tensors, "cpu")
    # a worker that dies before any candidate (here: tensors it cannot build) ends the search
    bad = {name: dict(spec, dtype="no_such_dtype") for name, spec in tensors.items()}
    with pytest.raises(RuntimeError, match="no candidate ran"):
        autotune.pick([choices[1]], bad, "cpu")
