"""Channels-last (NHWC) layout for 2-D convolutions (config.conv_channels_last).

There is no GPU here, so the mode is forced on (True) for CPU graphs: torch's CPU convolution,
like cuDNN, returns NHWC for NHWC input and weight, so the same wrapper runs with no layout copy.
"""

import copy

import pytest
import torch
from ember.inductor import compile_fx, compile_prims, config, metrics, runtime
from ember.inductor.lowering import wants_channels_last
from ember.primtorch import trace_to_prims
from inductor_helpers import check
from torch import nn
from torch.nn import functional as F

CL = torch.channels_last


class Block(nn.Module):
    """conv-BN-ReLU-conv-BN plus the residual, then ReLU (a ResNet basic block)."""

    def __init__(self, c):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(y)) + x)


def resnet_like(dtype=torch.float32):
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
        Block(8),
        Block(8),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    ).to(dtype)


TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=1e-2, rtol=1e-2)}


@pytest.fixture
def channels_last(monkeypatch):
    monkeypatch.setattr(config, "conv_channels_last", True)
    monkeypatch.setattr(config, "fx_cache", False)


@pytest.fixture
def layout_copies(monkeypatch):
    """Every copy `restride` makes (a wrapper value whose strides are not the expected ones)."""
    copies, real = [], runtime.restride

    def counting(t, sizes, strides):
        out = real(t, sizes, strides)
        if out is not t:
            copies.append((tuple(sizes), t.stride(), tuple(strides)))
        return out

    monkeypatch.setattr(runtime, "restride", counting)  # the wrapper imports it when it loads
    return copies


def _conv_steps(compiled):
    """(input, weight, output) strides of each convolution extern of a compiled graph."""
    bufs = {b.name: tuple(map(int, b.meta.strides)) for b in compiled.artifact.buffers}
    bufs.update({name: t.stride() for name, t in compiled.constants.items()})  # get_attr weights
    out = []
    for s in compiled.artifact.steps:
        if s.kind == "extern" and s.target == "extern.convolution":
            out.append((bufs[s.args[0]["node"]], bufs[s.args[1]["node"]], bufs[s.outputs[0]]))
    return out


def _is_nhwc(sizes, strides):
    return torch.empty_strided(sizes, strides).is_contiguous(memory_format=CL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inference_runs_nhwc_end_to_end(dtype, channels_last, layout_copies):
    model = resnet_like(dtype).eval()
    x = torch.randn(2, 3, 16, 16, dtype=dtype)
    with torch.no_grad():
        gm = trace_to_prims(model, x)
        compiled = compile_prims(gm, [x])
        got = compiled(x)
        got = got[0] if isinstance(got, (tuple, list)) else got
        torch.testing.assert_close(got, model(x), **TOL[dtype])
    convs = _conv_steps(compiled)
    assert len(convs) == 5
    shapes = [(2, 3, 16, 16), (2, 8, 4, 4)]  # the stem's input, then every block conv's
    for (xs, ws, os_), in_sizes in zip(convs, [shapes[0]] + [shapes[1]] * 4):
        assert _is_nhwc(in_sizes, xs) and xs != torch.empty(in_sizes).stride(), xs
        assert _is_nhwc((8, in_sizes[1], 3, 3), ws), ws
        assert os_[1] == 1, os_  # NHWC output: channels innermost
    assert layout_copies == []  # torch returned each conv's declared layout: no restride copy
    assert not metrics.fallbacks


def test_pointwise_between_convs_is_nhwc(channels_last):
    """The BN/ReLU/residual kernels between convs write NHWC: the next conv needs no copy."""
    model = resnet_like().eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        compiled = compile_prims(trace_to_prims(model, x), [x])
    bufs = {b.name: b for b in compiled.artifact.buffers}
    conv_inputs = [s.args[0]["node"] for s in compiled.artifact.steps
                   if s.kind == "extern" and s.target == "extern.convolution"]  # fmt: skip
    written_by_kernels = {o for s in compiled.artifact.steps if s.kind == "kernel"
                          for o in s.args if isinstance(o, str)}  # fmt: skip
    # every conv after the stem reads a buffer a fused kernel wrote in NHWC
    for name in conv_inputs[1:]:
        assert name in written_by_kernels
        meta = bufs[name].meta
        assert _is_nhwc(tuple(map(int, meta.sizes)), tuple(map(int, meta.strides)))


def _train_step(model, run, x):
    model.zero_grad()
    run(x).float().square().mean().backward()
    return [p.grad for p in model.parameters()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_training_step_matches(dtype, channels_last, layout_copies):
    """fp32 grads match eager; bf16 ones match the NCHW compile (eager bf16 rounds differently:
    on this model both differ from an fp32 reference by up to a third of the largest grad)."""
    model = resnet_like(dtype).train()
    twin = copy.deepcopy(model)
    x = torch.randn(2, 3, 16, 16, dtype=dtype)
    grads = _train_step(model, compile_fx(torch.fx.symbolic_trace(model), [x]), x)
    assert layout_copies == []  # the backward's convolution grads come back as declared
    if dtype == torch.float32:
        expected = _train_step(twin, twin, x)
    else:
        config.conv_channels_last = False
        expected = _train_step(twin, compile_fx(torch.fx.symbolic_trace(twin), [x]), x)
    for (name, p), g, e in zip(model.named_parameters(), grads, expected):
        torch.testing.assert_close(g, e, **TOL[dtype], msg=name)
        assert g.stride() == p.stride(), name  # grads in their parameters' layout
    for b, c in zip(model.buffers(), twin.buffers()):  # batch-norm running statistics
        torch.testing.assert_close(b, c, **TOL[dtype])


def _conv_then(tail):
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, padding=1)

    def fn(x):
        return tail(torch.relu(conv(x)))

    return fn


VIEW_TAILS = {
    "flatten": lambda y: y.flatten(1),  # a reshape of an NHWC buffer is no view: a gather
    "reshape_spatial": lambda y: y.reshape(2, 6, 25),
    "permute": lambda y: y.permute(0, 2, 3, 1) * 2,
    "unfold": lambda y: y.unfold(3, 2, 1),  # as_strided on eager's layout
    "channels_slice": lambda y: y[:, 1:4] + 1,
    "conv_output": lambda y: y,  # a graph output keeps eager's layout
    "mean": lambda y: y.mean((2, 3)),
}


@pytest.mark.parametrize("tail", sorted(VIEW_TAILS))
def test_views_of_nhwc_buffers(tail, channels_last):
    fn = _conv_then(VIEW_TAILS[tail])
    with torch.no_grad():
        check(fn, torch.randn(2, 4, 5, 5), atol=1e-5, rtol=1e-5)  # values and output strides


def test_grouped_strided_and_biased_convs(channels_last, layout_copies):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(4, 8, 3, stride=2, padding=1, bias=True),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8),  # depthwise
        nn.Conv2d(8, 4, 1, groups=2),
        nn.ConvTranspose2d(4, 4, 3, stride=2, padding=1, output_padding=1),
    ).eval()
    x = torch.randn(2, 4, 9, 9)
    with torch.no_grad():
        compiled = compile_prims(trace_to_prims(model, x), [x])
        got = compiled(x)
        got = got[0] if isinstance(got, (tuple, list)) else got
        expected = model(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert got.stride() == expected.stride()
    assert layout_copies == []


def _conv_graph(device="cpu"):
    x, w = torch.randn(1, 2, 4, 4), torch.randn(3, 2, 3, 3)
    return trace_to_prims(lambda a, b: torch.conv2d(a, b), x, w), [x, w]


def test_mode_selection(monkeypatch):
    gm, _ = _conv_graph()
    monkeypatch.setattr(config, "conv_channels_last", "auto")
    assert wants_channels_last(gm)  # auto: CPU inference in process (torch's oneDNN convolution)
    monkeypatch.setattr(config, "packaging", True)
    assert not wants_channels_last(gm)  # ... but not a package's C++ convolution
    monkeypatch.setattr(config, "packaging", False)
    gm.meta["ember_training"] = "forward"
    assert not wants_channels_last(gm)  # nor training
    del gm.meta["ember_training"]
    monkeypatch.setattr(config, "conv_channels_last", True)
    assert wants_channels_last(gm)
    monkeypatch.setattr(config, "conv_channels_last", False)
    assert not wants_channels_last(gm)
    mm = trace_to_prims(lambda a: torch.relu(a) + 1, torch.randn(2, 3, 4, 4))
    monkeypatch.setattr(config, "conv_channels_last", True)
    assert not wants_channels_last(mm)  # no convolution: nothing to lay out
    # auto on a CUDA graph: inference graphs only (training's saved activations would be copied
    # between layouts on their way from forward to backward)
    import dataclasses

    from ember.ir import NODE_META_KEY

    for n in gm.graph.nodes:
        meta = n.meta.get(NODE_META_KEY)
        if meta is not None and hasattr(meta, "device"):
            n.meta[NODE_META_KEY] = dataclasses.replace(meta, device="cuda:0")
    monkeypatch.setattr(config, "conv_channels_last", "auto")
    assert wants_channels_last(gm)
    gm.meta["ember_training"] = "forward"
    assert not wants_channels_last(gm)
    monkeypatch.setattr(config, "conv_channels_last", True)
    assert wants_channels_last(gm)


@pytest.mark.parametrize("mode", [False, "auto"])
def test_off_keeps_nchw(mode, monkeypatch):
    monkeypatch.setattr(config, "conv_channels_last", mode)
    monkeypatch.setattr(config, "packaging", mode == "auto")  # auto: NCHW in a CPU package
    model = resnet_like().eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        compiled = compile_prims(trace_to_prims(model, x), [x])
    for xs, ws, os_ in _conv_steps(compiled):
        assert os_[-1] == 1 and xs[-1] == 1 and ws[-1] == 1  # contiguous (NCHW)


def test_bias_computed_in_the_graph(channels_last):
    # Under autocast the bias reaches the convolution as a cast computed in the graph (a value
    # not yet in a buffer), as in a ViT's patch embedding.
    x, w, b = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 4, 4), torch.randn(4)
    with torch.no_grad():
        check(lambda x, w, b: torch.conv2d(x, w, b * 2, stride=4), x, w, b, atol=1e-5, rtol=1e-5)


def test_rows_padded_to_a_multiple_are_recognised_with_symbolic_sizes():
    """A layout in rows rounded up to a multiple of 16 (the memory-efficient attention's bias)
    is a buffer of whole padded rows, static or symbolic; a dense layout is not padded."""
    import sympy

    from ember.inductor.lowering import _padded_rows
    from ember.ir import contiguous_strides

    s = sympy.Symbol("s0", integer=True, positive=True)
    row = 16 * sympy.ceiling(s / 16)
    assert _padded_rows((2, 3, s, s), contiguous_strides((2, 3, s, row))) == (2, 3, s, row)
    assert _padded_rows((2, 3, s, s), contiguous_strides((2, 3, s, s))) is None
    assert _padded_rows((2, 3, s, s + 16), contiguous_strides((2, 3, s, row))) is None  # row < size
    assert _padded_rows((4, 77), (80, 1)) == (4, 80)
    assert _padded_rows((4, 80), (80, 1)) is None


class Branches(nn.Module):
    """An Inception/HRNet fan-out: one ReLU'd feature map read by three branch convolutions."""

    def __init__(self, c):
        super().__init__()
        self.stem = nn.Conv2d(c, c, 3, padding=1)
        self.b = nn.ModuleList(nn.Conv2d(c, c // 2, k, padding=k // 2) for k in (1, 3, 5))

    def forward(self, x):
        y = torch.relu(self.stem(x) * 2)
        return torch.cat([conv(y) for conv in self.b], 1)


@pytest.mark.parametrize("nhwc", [False, True], ids=["nchw", "nhwc"])
def test_a_value_read_by_several_convolutions_is_computed_once(nhwc, monkeypatch):
    """relu(conv(x) * 2) feeds three convolutions: one buffer, one kernel, whichever layout (each
    branch wrote its own copy before; here no kernel joins another ahead of an extern, as at real
    sizes, so each copy was a kernel of its own)."""
    monkeypatch.setattr(config, "conv_channels_last", nhwc)
    monkeypatch.setattr(config, "hoist_max_bytes", 0)
    torch.manual_seed(0)
    model, x = Branches(8).eval(), torch.randn(2, 8, 6, 6)
    with torch.no_grad():
        gm = trace_to_prims(model, x)
        compiled = compile_prims(gm, [x])
        got = compiled(x)
        got = got[0] if isinstance(got, (list, tuple)) else got
        torch.testing.assert_close(got, model(x), atol=1e-4, rtol=1e-4)
    # before: the ReLU kernel stored a copy per branch (2 more kernels, NCHW 4 / NHWC 8)
    assert len(compiled.program.kernels) == (6 if nhwc else 2), compiled.source
    convs = compiled.source.count("extern_convolution(")
    assert convs == 4, compiled.source
    # the stem's epilogue (x2, ReLU) is one kernel storing one buffer that all branches read
    reads = [line for line in compiled.source.splitlines() if "extern_convolution(" in line]
    branch_inputs = {line.split("extern_convolution(")[1].split(",")[0] for line in reads[1:]}
    assert len(branch_inputs) == 1, compiled.source


@pytest.mark.parametrize("nhwc", [False, True], ids=["nchw", "nhwc"])
def test_conv_bias_is_added_by_the_kernel_reading_the_output(nhwc, monkeypatch):
    """config.conv_bias_epilogue (on for CUDA, where torch's convolution adds a bias with a kernel
    of its own): a convolution is called without its bias, which the kernel reading its output
    adds: the batch norm's, the max pool's (no kernel more)."""
    monkeypatch.setattr(config, "conv_channels_last", nhwc)
    monkeypatch.setattr(config, "fx_cache", False)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 1), nn.MaxPool2d(2)).eval()  # fmt: skip
    model[1].running_mean.normal_()
    x = torch.randn(2, 4, 8, 8)
    compiled = {}
    for mode in (False, True):
        monkeypatch.setattr(config, "conv_bias_epilogue", mode)
        with torch.no_grad():
            compiled[mode] = compile_prims(trace_to_prims(model, x), [x])
            got = compiled[mode](x)
            got = got[0] if isinstance(got, (list, tuple)) else got
            torch.testing.assert_close(got, model(x), atol=1e-4, rtol=1e-4)
    calls = [line for line in compiled[True].source.splitlines() if "extern_convolution(" in line]
    assert len(calls) == 2, compiled[True].source
    assert all(", None," in line for line in calls), calls
    before = [line for line in compiled[False].source.splitlines() if "extern_convolution(" in line]
    assert all(", None," not in line for line in before), before
    assert len(compiled[True].program.kernels) == len(compiled[False].program.kernels)


@pytest.mark.parametrize("view", ["diagonal", "unfold"])
def test_a_view_of_a_convolution_with_its_bias_still_to_add_addresses_eagers_layout(
        view, monkeypatch):  # fmt: skip
    """as_strided strides address eager's layout of what they view: a convolution's output
    whose bias the reader adds (config.conv_bias_epilogue) is stored in it first, not row-major
    (an NHWC output outside channels-last mode read 18.0 off)."""
    monkeypatch.setattr(config, "conv_bias_epilogue", True)
    monkeypatch.setattr(config, "conv_channels_last", False)
    monkeypatch.setattr(config, "fx_cache", False)
    torch.manual_seed(0)
    w, b = torch.randn(4, 3, 3, 3), torch.randn(4)
    x = torch.randn(2, 3, 6, 6).to(memory_format=torch.channels_last)
    if view == "diagonal":
        check(lambda x: F.conv2d(x, w, b).diagonal(0, 2, 3), x, atol=1e-4, rtol=1e-4)
    else:
        check(lambda x: F.conv2d(x, w, b).unfold(2, 2, 1), x, atol=1e-4, rtol=1e-4)


@torch.library.custom_op("ember_layout_tests::rows", mutates_args=())
def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.view(x.shape[0], -1).clone()  # a kernel that assumes eager's (contiguous) layout


@_rows.register_fake
def _(x):
    return x.new_empty(x.shape[0], x[0].numel())


@pytest.mark.parametrize("rank", [3, 4])
def test_a_user_operator_gets_its_arguments_in_eagers_strides(rank, channels_last):
    """In channels-last mode values are stored by their reads (NHWC, or a flattened NHWC
    output's (B, N, C) order): a user operator, which may assume eager's strides, gets them."""
    torch.manual_seed(0)
    w, b = torch.randn(8, 3, 3, 3), torch.randn(8)

    def f(x):
        y = torch.relu(F.conv2d(x, w, b, padding=1))
        return _rows(y.flatten(2) if rank == 3 else y * 2)

    check(f, torch.randn(2, 3, 5, 5), atol=1e-4, rtol=1e-4)
