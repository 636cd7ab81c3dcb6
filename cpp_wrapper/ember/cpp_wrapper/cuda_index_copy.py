"""A decode step's cache updates on CUDA as a Triton kernel of the package, not a host loop.

`donate_index_puts` turns each cache update into an in-place `prims.index_put` step (`values`
written into the cache at `index` along its first dimension). The runtime's extern for it reads
the index on the host: a stream synchronisation per update, dozens per step of a decoder, each
of which drains the GPU before the host may queue the next kernel. `launch_index_copies`
replaces those steps of a CUDA artifact by launches of one small kernel (per dtype combination)
that reads the index on the GPU: one thread per element of the update, strides and sizes as
run-time arguments, so one cubin serves every cache and any number of new tokens. A layer's
two updates (keys and values: same shape, same positions) are one launch of the pair variant.

A position outside the cache's rows is skipped (the CPU extern raises; a kernel cannot without
stopping the stream), after negative ones count from the end, as indexing does.
"""

from __future__ import annotations

import dataclasses

import sympy

from ember.ir import CompiledArtifact, FloorDiv, KernelIR, StepIR
from ember.ir.symbols import expr_to_json

from .codegen_values import parse_expr
from .exported import resolve_entry

BLOCK = 256  # elements per program
DIMS = 4  # the update's dimensions after the indexed one are padded to DIMS - 1
NAME = "ember_index_copy"
SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def _copy(DST, IDX, SRC, N, A, B, C, ROWS, DS0, DS1, DS2, DS3, SS0, SS1, SS2, SS3, IS0,
          BLOCK: tl.constexpr):
    # element (j, a, b, c) of the update: SRC's (j, a, b, c) into DST's (IDX[j], a, b, c)
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = lin < N
    if N < 2147483648:  # the split of the element's number in 32 bits (64-bit division is slow)
        lin32 = lin.to(tl.int32)
        c32 = C.to(tl.int32)
        b32 = B.to(tl.int32)
        a32 = A.to(tl.int32)
        r32 = lin32 // c32
        c = (lin32 % c32).to(tl.int64)
        b = (r32 % b32).to(tl.int64)
        r32 = r32 // b32
        a = (r32 % a32).to(tl.int64)
        j = (r32 // a32).to(tl.int64)
    else:
        c = lin % C
        rest = lin // C
        b = rest % B
        rest = rest // B
        a = rest % A
        j = rest // A
    # the values are read while the position is (neither waits for the other)
    v = tl.load(SRC + j * SS0 + a * SS1 + b * SS2 + c * SS3, mask=ok)
    pos = tl.load(IDX + j * IS0, mask=ok, other=0).to(tl.int64)
    pos = tl.where(pos < 0, pos + ROWS, pos)
    ok = ok & (pos >= 0) & (pos < ROWS)
    tl.store(DST + pos * DS0 + a * DS1 + b * DS2 + c * DS3, v.to(DST.dtype.element_ty), mask=ok)


@triton.jit
def ember_index_copy(DST, IDX, SRC, N, A, B, C, ROWS, DS0, DS1, DS2, DS3, SS0, SS1, SS2, SS3,
                     IS0, BLOCK: tl.constexpr):
    _copy(DST, IDX, SRC, N, A, B, C, ROWS, DS0, DS1, DS2, DS3, SS0, SS1, SS2, SS3, IS0, BLOCK)


@triton.jit
def ember_index_copy2(DST, DST2, IDX, SRC, SRC2, N, A, B, C, ROWS, DS0, DS1, DS2, DS3, SS0, SS1,
                      SS2, SS3, ES0, ES1, ES2, ES3, TS0, TS1, TS2, TS3, IS0, BLOCK: tl.constexpr):
    # two updates of one shape at the same positions (a layer's keys and values), one launch:
    # grid axis 1 picks the update; DST2 at strides ES, SRC2 at strides TS
    if tl.program_id(1) == 0:
        _copy(DST, IDX, SRC, N, A, B, C, ROWS, DS0, DS1, DS2, DS3, SS0, SS1, SS2, SS3, IS0, BLOCK)
    else:
        _copy(DST2, IDX, SRC2, N, A, B, C, ROWS, ES0, ES1, ES2, ES3, TS0, TS1, TS2, TS3, IS0,
              BLOCK)
'''
PAIR = NAME + "2"


def triton_type(meta) -> str:
    """The Triton element type of a buffer's pointer ("bf16"), as inductor's kernels name it."""
    try:
        return resolve_entry("buffer_ptr_type")(meta.dtype)[1:]
    except KeyError:
        raise NotImplementedError(f"no Triton type for {meta.dtype}") from None


def cubin_kernel(name: str, source: str, entry: str, arg_types: tuple, cfg: dict,
                 arch=None) -> KernelIR:
    """The package's kernel `name`: the @triton.jit `entry` of `source` compiled to a cubin for
    sm_`arch` (the current GPU's by default) with the constexprs and num_warps of `cfg`."""
    c = resolve_entry("compile_kernel")(source, entry, arg_types, cfg, arch)
    return KernelIR(name, "triton", source, c.name, arg_types, num_warps=c.num_warps,
                    shared_mem=c.shared_mem, binary=c.path)  # fmt: skip


def _padded(sizes, strides) -> tuple[list, list]:
    """Sizes and strides with dimensions 1.. padded to DIMS - 1 (size 1, stride 0)."""
    sizes, strides = list(sizes), list(strides)
    if len(sizes) > DIMS:
        raise NotImplementedError(f"an update of {len(sizes)} dimensions (at most {DIMS})")
    pad = DIMS - len(sizes)
    return sizes + [sympy.Integer(1)] * pad, strides + [sympy.Integer(0)] * pad


def _json(e):
    e = sympy.sympify(e)
    return int(e) if e.is_Integer else {"expr": expr_to_json(e)}


def _name(value) -> str:
    return value["node"] if isinstance(value, dict) else str(value)


def _layouts(artifact: CompiledArtifact):
    """A function giving a buffer's (sizes, strides): a view step's own, else its metadata."""
    views = {}
    for step in artifact.steps:
        if step.kind == "view" and step.args[1] is not None:
            sizes, strides, _ = step.args[1]
            views[step.outputs[0]] = ([parse_expr(x) for x in sizes],
                                      [parse_expr(x) for x in strides])  # fmt: skip

    def layout_of(name: str) -> tuple:
        if name in views:
            return views[name]
        m = artifact.buffer(name).meta
        return [sympy.sympify(x) for x in m.sizes], [sympy.sympify(x) for x in m.strides]

    return layout_of


def index_copy_step(artifact: CompiledArtifact, step: StepIR, layout_of) -> tuple[StepIR, tuple]:
    """The kernel step for one in-place `prims.index_put(out, [index], values)` step, and its
    kernel's (name, arg_types). `layout_of(name)` gives a buffer's (sizes, strides)."""
    if len(step.args[1]) != 1:
        raise NotImplementedError("more than one index tensor")
    out, index, values = step.outputs[0], _name(step.args[1][0]), _name(step.args[2])
    dst_sizes, dst_strides = layout_of(out)
    idx_sizes, idx_strides = layout_of(index)
    src_sizes, src_strides = layout_of(values)
    if len(idx_sizes) != 1:
        raise NotImplementedError("an index of more than one dimension")
    shape = [idx_sizes[0], *dst_sizes[1:]]  # the update's shape: values broadcast to it
    lead = len(shape) - len(src_sizes)
    if lead < 0:
        raise NotImplementedError("values of more dimensions than the update")
    src = [(sympy.Integer(0) if i < lead or src_sizes[i - lead] == 1 else src_strides[i - lead])
           for i in range(len(shape))]  # fmt: skip
    sizes, dst = _padded(shape, dst_strides)
    _, src = _padded(shape, src)
    n = sympy.Mul(*[sympy.sympify(s) for s in sizes])
    types = tuple(triton_type(artifact.buffer(b).meta) for b in (out, index, values))
    kernel = f"{NAME}_{'_'.join(types)}"
    args = [{"node": out}, {"node": index}, {"node": values},
            *(_json(x) for x in (n, *sizes[1:], dst_sizes[0], *dst, *src, idx_strides[0]))]
    grid = [_json(FloorDiv(n + BLOCK - 1, BLOCK))]
    arg_types = (*(f"*{t}" for t in types), *("i64",) * (len(args) - 3))
    return StepIR("kernel", kernel, args, {"grid": grid}, (out,)), (kernel, arg_types)


def launch_index_copies(artifact: CompiledArtifact, arch=None) -> CompiledArtifact:
    """`artifact` (CUDA) with its in-place index_put steps launched as `ember_index_copy`
    kernels (compiled to cubins for sm_`arch`, the current GPU's by default), two updates of one
    shape at the same positions in one launch (`pair_index_copies`); an update the kernel cannot
    take keeps its extern."""
    layout_of = _layouts(artifact)
    steps, kernels = [], {}
    for step in artifact.steps:
        if not (step.kind == "extern" and step.target == "prims.index_put"
                and (step.kwargs or {}).get("in_place")):  # fmt: skip
            steps.append(step)
            continue
        try:
            new, (name, arg_types) = index_copy_step(artifact, step, layout_of)
        except NotImplementedError:
            steps.append(step)
            continue
        steps.append(new)
        kernels[name] = arg_types
    if not kernels:
        return artifact
    steps, kernels = pair_index_copies(steps, kernels)
    built = [cubin_kernel(name, SOURCE, entry, arg_types, {"BLOCK": BLOCK, "num_warps": 4}, arch)
             for name, (entry, arg_types) in sorted(kernels.items())]  # fmt: skip
    return dataclasses.replace(artifact, steps=tuple(steps),
                               kernels=(*artifact.kernels, *built))  # fmt: skip


# index_copy_step's arguments: out, index, values, then N, A, B, C, ROWS, 4 + 4 strides, IS0
_SHARED = slice(3, 8)  # N, A, B, C, ROWS: the update's shape and the cache's rows


def pair_index_copies(steps: list, kernels: dict) -> tuple[list, dict]:
    """Each index-copy launch merged with the next one that copies a same-shaped update of the
    same dtypes at the same positions into another buffer, reading neither's destination (the
    two run at once), where only views, allocations and frees come between (a decoder layer's
    keys and values): one launch of `ember_index_copy2` in the later one's place, a free of the
    first's buffers in between moved after it (none with an allocation after it: that
    allocation may take the freed memory). Returns the steps and {kernel name: (entry,
    arg_types)}."""
    out, used = [], {}
    pending, moved = None, []  # the index in `out` of an unpaired copy; its buffers' frees since
    base: dict = {}  # a view's name -> the buffer it views (followed to the end)

    def root(value) -> str:
        name = _name(value)
        return base.get(name, name)

    def independent(a: StepIR, b: StepIR) -> bool:
        """May the two copies run at once: neither writes what the other reads or writes?"""
        dst_a, dst_b = root(a.args[0]), root(b.args[0])
        reads_a, reads_b = {root(a.args[1]), root(a.args[2])}, {root(b.args[1]), root(b.args[2])}
        return dst_a != dst_b and dst_a not in reads_b and dst_b not in reads_a

    def single():
        used[out[pending].target] = (NAME, kernels[out[pending].target])

    for step in steps:
        if step.kind == "view":
            base[step.outputs[0]] = root(step.args[0])
        if step.kind == "kernel" and step.target.startswith(NAME + "_"):
            first = out[pending] if pending is not None else None
            if first is not None and first.target == step.target and \
                    first.args[1] == step.args[1] and first.args[_SHARED] == step.args[_SHARED] \
                    and independent(first, step):  # fmt: skip
                args = [first.args[0], step.args[0], first.args[1], first.args[2],
                        step.args[2], *first.args[3:16], *step.args[8:16], first.args[16]]
                name = PAIR + step.target[len(NAME):]
                out_t, index_t, values_t, size_t = kernels[step.target][:4]
                used[name] = (PAIR, (out_t, out_t, index_t, values_t, values_t,
                                     *(size_t,) * (len(args) - 5)))  # fmt: skip
                out.append(StepIR("kernel", name, args, {"grid": [*first.kwargs["grid"], 2]},
                                  (first.outputs[0], step.outputs[0])))  # fmt: skip
                out.extend(out[i] for i in moved)
                for i in (pending, *moved):
                    out[i] = None
                pending, moved = None, []
                continue
            if first is not None:
                single()
            pending, moved = len(out), []
            out.append(step)
            continue
        if pending is not None:
            mine = {_name(a) for a in out[pending].args[:3]}
            if step.kind == "free" and _name(step.args[0]) in mine:
                moved.append(len(out))
            elif step.kind not in ("view", "free") and not (step.kind == "alloc" and not moved):
                single()
                pending = None
        out.append(step)
    if pending is not None:
        single()
    return [s for s in out if s is not None], used


__all__ = ["SOURCE", "cubin_kernel", "index_copy_step", "launch_index_copies", "pair_index_copies",
           "triton_type"]
