"""fold_device_constants: scalars computed on the CPU from constants and moved to a GPU become
constants made there, so the program has no host step (which would keep it off CUDA graphs)."""

import math

import torch
from torch import fx

from ember.inductor.device_constants import fold_device_constants
from ember.ir import NODE_META_KEY, TensorMeta, target_name
from ember.primtorch import prims

CPU, GPU = torch.device("cpu"), torch.device("cuda")


def _call(graph, prim, *args):
    """A node of `prim` with its TensorMeta, as a traced prim graph has."""
    node = graph.call_function(prim, args)
    metas = [a.meta[NODE_META_KEY] if isinstance(a, fx.Node) else a for a in args]
    node.meta[NODE_META_KEY] = prim.meta(*metas)
    return node


def _attention_scale_graph(head_dim=64, factor=3):
    """x / sqrt(tensor(head_dim) * factor), the scalar built on the CPU (DeBERTa's scale)."""
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta[NODE_META_KEY] = TensorMeta(torch.float32, (4, 8), (8, 1), 0, "cuda")
    size = _call(g, prims.full, (), head_dim, torch.float32, CPU)
    scaled = _call(g, prims.mul, size, float(factor))
    scale = _call(g, prims.sqrt, scaled)
    on_gpu = _call(g, prims.device_put, scale, GPU)
    out = _call(g, prims.div, x, _call(g, prims.broadcast_in_dim, on_gpu, (4, 8), ()))
    g.output((out,))
    return fx.GraphModule(torch.nn.Module(), g)


def _targets(gm):
    return [target_name(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_constant_scalar_is_made_on_the_device():
    gm = _attention_scale_graph()
    before = _targets(gm)
    folded = fold_device_constants(gm)
    assert "prims.device_put" in before and _targets(gm) == before  # the caller's graph is kept
    assert _targets(folded) == ["prims.full", "prims.broadcast_in_dim", "prims.div"]
    full = next(n for n in folded.graph.nodes if n.target is prims.full)
    shape, value, dtype, device = full.args
    assert shape == () and dtype == torch.float32 and device == GPU
    assert value == torch.sqrt(torch.tensor(64.0) * 3).item()
    assert math.isclose(value, math.sqrt(192), rel_tol=1e-7)
    assert str(full.meta[NODE_META_KEY].device) == "cuda"


def test_values_that_depend_on_inputs_stay_host_steps():
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta[NODE_META_KEY] = TensorMeta(torch.float32, (4,), (1,), 0, "cuda")
    s = g.placeholder("s")  # a CPU scalar tensor argument
    s.meta[NODE_META_KEY] = TensorMeta(torch.float32, (), (), 0, "cpu")
    doubled = _call(g, prims.mul, s, 2.0)
    moved = _call(g, prims.device_put, doubled, GPU)
    g.output((_call(g, prims.mul, x, _call(g, prims.broadcast_in_dim, moved, (4,), ())),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    assert fold_device_constants(gm) is gm


def test_random_and_multi_element_values_stay():
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta[NODE_META_KEY] = TensorMeta(torch.float32, (3,), (1,), 0, "cuda")
    ramp = _call(g, prims.iota, 3, 0, 1, torch.float32, CPU)  # three elements: not a scalar
    moved = _call(g, prims.device_put, ramp, GPU)
    g.output((_call(g, prims.add, x, moved),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    assert fold_device_constants(gm) is gm


def test_an_aten_kernel_takes_its_host_scalars_where_they_are():
    """The memory-efficient attention's backward reads its philox seed and offset on the host:
    in a CUDA program they reach it as the CPU tensors they are (moved to the GPU, the kernel
    read a device pointer on the CPU and the process died), and the program is not captured in
    a CUDA graph (its host values would be read once, at capture)."""
    from ember.inductor.cudagraphs import host_work
    from ember.inductor.loop_ir import ExternBuffer, InputBuffer
    from ember.inductor.lowering import lower_graph
    from ember.inductor.pipeline import render_kernels
    from ember.inductor.scheduler import schedule
    from ember.inductor.wrapper import generate
    from ember.primtorch.prims import extern

    g = fx.Graph()

    def arg(name, sizes, dtype=torch.bfloat16, device="cuda"):
        p = g.placeholder(name)
        strides = tuple(math.prod(sizes[i + 1:]) for i in range(len(sizes)))
        p.meta[NODE_META_KEY] = TensorMeta(dtype, sizes, strides, 0, device)
        return p

    qkv = (2, 4, 128, 64)
    grad, q, k, v, out = (arg(n, qkv) for n in ("grad", "q", "k", "v", "out"))
    lse = arg("lse", (2, 4, 128), torch.float32)
    seed, offset = arg("seed", (), torch.int64, "cpu"), arg("offset", (), torch.int64, "cpu")
    node = _call(g, extern.sdpa_efficient_backward, grad, q, k, v, None, out, lse, seed, offset,
                 0.1, [True, True, True, False])  # fmt: skip
    g.output(tuple(g.call_function(__import__("operator").getitem, (node, i)) for i in range(3)))
    for i, n in enumerate(list(g.nodes)[-4:-1]):
        n.meta[NODE_META_KEY] = node.meta[NODE_META_KEY][i]
    gm = fx.GraphModule(torch.nn.Module(), g)
    examples = [torch.empty(p.meta[NODE_META_KEY].sizes, device="meta")
                for p in gm.graph.find_nodes(op="placeholder")]  # fmt: skip
    low = lower_graph(gm, examples)
    (call,) = [b for b in low.buffers if isinstance(b, ExternBuffer)]
    host = [a for a in call.args if isinstance(a, InputBuffer) and str(a.layout.device) == "cpu"]
    assert [a.name for a in host] == ["arg6", "arg7"]  # seed and offset, not copies
    assert not [b for b in low.buffers if isinstance(b, ExternBuffer) and "device_put" in b.op]
    steps = schedule(low.buffers, [o.name for o in low.outputs])
    buffers = {b.name: b for b in [*low.inputs, *low.buffers] if b is not None}
    program = generate(low, steps, render_kernels(steps, buffers, low.device))
    assert host_work(program.artifact)


def _implicit_read_graph(source):
    """x (on the GPU) / a CPU value broadcast to x's shape, read with no device_put: the
    lowering would copy it to the GPU at every call."""
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta[NODE_META_KEY] = TensorMeta(torch.float32, (4, 8), (8, 1), 0, "cuda")
    cpu = source(g)
    rank = len(cpu.meta[NODE_META_KEY].sizes)
    wide = _call(g, prims.broadcast_in_dim, cpu, (4, 8), tuple(range(2 - rank, 2)))
    out = g.call_function(prims.div, (x, wide))
    out.meta[NODE_META_KEY] = x.meta[NODE_META_KEY]  # the GPU's result
    g.output((out,))
    return fx.GraphModule(torch.nn.Module(), g)


def test_a_constant_the_gpu_reads_directly_is_made_there():
    def scale(g):
        return _call(g, prims.sqrt, _call(g, prims.full, (), 48.0, torch.float32, CPU))

    folded = fold_device_constants(_implicit_read_graph(scale))
    assert _targets(folded) == ["prims.full", "prims.div"]
    full = next(n for n in folded.graph.nodes if n.target is prims.full)
    assert full.args == ((4, 8), torch.sqrt(torch.tensor(48.0)).item(), torch.float32, GPU)
    assert str(full.meta[NODE_META_KEY].device) == "cuda"


def test_a_cpu_value_of_several_numbers_read_on_the_gpu_stays():
    def ramp(g):
        return _call(g, prims.iota, 8, 0, 1, torch.float32, CPU)

    gm = _implicit_read_graph(ramp)
    assert fold_device_constants(gm) is gm
