"""Matmul templates (max-autotune): a library mm/addmm/bmm/baddbmm call as a generated Triton GEMM
whose pointwise readers run in its store (the epilogue), chosen against the call by timing.

After scheduling, each such extern step with static sizes and a float16/bfloat16/float32 product
may become a `GemmKernel`: a blocked GEMM (tl.dot over K in BLOCK_K steps, float32 accumulator,
tiles of XBLOCK rows by YBLOCK columns) that takes over the first pointwise kernel reading the
product, when that kernel loops over exactly the product's sizes and reads the product only at
the element it computes (a bias, an activation, a residual add, a cast). Its members then run on
the accumulator's tile, rendered by the Triton renderer itself (tile rows and columns stand for
the kernel's loop variables), and the product is never written unless something else reads it.
An operand that is a lone cast (a weight cast under autocast) is read from the cast's source and
converted block by block (a prologue), and the cast's kernel is dropped.
`choose_templates` renders every config of `gemm_configs`, has `autotune.pick_many` time them
against the library call plus the separate epilogue kernel, and keeps whichever is faster.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional

import sympy
import torch

from . import metrics
from .codegen_common import CantRender, CSEVar, KernelSource, buffer_ptr_type
from .codegen_triton import TL, TritonRenderer, _bf16_rne, _indent, _interpreting, grid_of
from .config import config
from .loop_ir import AliasBuffer, Buffer, ComputedBuffer, ExternBuffer, TextHandler, loop_vars
from .loop_ir import set_handler
from .scheduler import Kernel, unit_steps

log = logging.getLogger("ember.inductor")

TEMPLATE_OPS = ("extern.mm", "extern.addmm", "extern.bmm", "extern.baddbmm")
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): tiles that do well on Hopper and Ampere for
# 16-bit operands (float32 ones halve BLOCK_K: their stages would not fit in shared memory).
HOPPER_CONFIGS = (
    (128, 256, 64, 8, 3), (128, 128, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 32, 4, 4),
    (64, 256, 32, 4, 4), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (64, 64, 32, 4, 4),
    (128, 32, 32, 4, 4), (64, 32, 32, 2, 5),
)  # fmt: skip
GROUP_M = 8  # rows of tiles walked together, so neighbouring programs share B's columns in L2


@dataclasses.dataclass
class Operand:
    """Where a template reads a matrix operand: buffer `name` at offset + sum(index * strides)
    (batch, row, column), converted to `cast` when set (a prologue: the operand was a cast's
    output, which the template computes from the cast's source instead)."""

    name: str
    offset: int
    strides: tuple
    cast: Optional[torch.dtype] = None
    producer: Optional[int] = None  # the step computing the cast, dropped with a template


def _plain(x: Buffer) -> Operand:
    return Operand(x.name, 0, _static(x.layout.strides))


@dataclasses.dataclass
class Gemm:
    """What a template multiplies: out[b] = alpha * a[b] @ b[b] + beta * bias (broadcast)."""

    ext: ExternBuffer
    a: Buffer
    b: Buffer
    bias: Optional[Buffer]
    alpha: float
    beta: float
    batch: int  # 0 for a 2-D product
    m: int
    n: int
    k: int
    ops: tuple = ()  # (Operand of a, Operand of b)

    def __post_init__(self):
        if not self.ops and self.a is not None:
            self.ops = (_plain(self.a), _plain(self.b))


@dataclasses.dataclass(eq=False)
class GemmKernel(Kernel):
    """A scheduled template: the product of `gemm` computed in the kernel, then `members` (its
    fused epilogue, possibly none) on each tile. `product` is the product's buffer when it is
    written to memory (a graph output, or read by another step), else None."""

    gemm: Gemm = None
    product: Optional[Buffer] = None
    source: Optional[KernelSource] = None

    @property
    def operands(self) -> dict:
        g = self.gemm
        names = [o.name for o in g.ops] + ([g.bias.name] if g.bias is not None else [])
        return dict.fromkeys(names)

    def produced(self) -> set:
        return super().produced() | ({self.product.name} if self.product is not None else set())

    def reads(self) -> set:
        return (super().reads() - {self.gemm.ext.name}) | set(self.operands)


def _static(xs) -> Optional[tuple]:
    xs = [sympy.sympify(x) for x in xs]
    return tuple(int(x) for x in xs) if all(x.is_Integer for x in xs) else None


def as_gemm(ext) -> Optional[Gemm]:
    """The product an extern step computes, if a template can compute it; else None."""
    if not isinstance(ext, ExternBuffer) or ext.op not in TEMPLATE_OPS or ext.outputs:
        return None
    batched = ext.op in ("extern.bmm", "extern.baddbmm")
    if ext.op in ("extern.mm", "extern.bmm"):
        if len(ext.args) != 2 or ext.kwargs:
            return None
        (a, b), bias, alpha, beta = ext.args, None, 1, 1
    else:
        if len(ext.args) != 3 or set(ext.kwargs) - {"alpha", "beta"}:
            return None
        bias, a, b = ext.args
        alpha, beta = ext.kwargs.get("alpha", 1), ext.kwargs.get("beta", 1)
        if not isinstance(bias, Buffer):
            return None
        if beta == 0:  # torch ignores the bias then (a NaN in it included)
            bias = None
    if not (isinstance(a, Buffer) and isinstance(b, Buffer)):
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (alpha, beta)):
        return None
    lay = ext.layout
    if not (a.dtype == b.dtype == lay.dtype and lay.dtype in _DTYPES):
        return None
    if bias is not None and bias.dtype != lay.dtype:
        return None
    for x in (ext, a, b, bias):
        if x is None:
            continue
        if _static(x.layout.sizes) is None or _static(x.layout.strides) is None:
            return None
        # a view's pointer carries its offset; any other buffer is passed from its start
        if not isinstance(x, AliasBuffer) and x.layout.offset != 0:
            return None
    out = _static(lay.sizes)
    if len(out) != 2 + batched or len(a.layout.sizes) != 2 + batched:
        return None
    m, n, k = out[-2], out[-1], int(a.layout.sizes[-1])
    if min(m, n, k) < 1 or (bias is not None and len(bias.layout.sizes) > len(out)):
        return None
    return Gemm(ext, a, b, bias, alpha, beta, out[0] if batched else 0, m, n, k)


def takes_epilogue(g: Gemm, k: Kernel) -> bool:
    """Whether kernel `k` can run on the template's tiles: pointwise, over exactly the product's
    sizes in its order, and reading the product only at the element it computes."""
    out = _static(g.ext.layout.sizes)
    if isinstance(k, GemmKernel) or k.rsizes or _static(k.xsizes) != out or not k.members:
        return False
    xs, _ = k.vars()
    want = sympy.expand(g.ext.layout.index(xs))
    for m in k.members:
        if m.node.ranges != k.xsizes or m.perm != tuple(range(len(out))):
            return False
        for name, index in k.record(m).loads:
            if name == g.ext.name and sympy.expand(index) != want:
                return False
    return True


def gemm_configs(g: Gemm) -> list[dict]:
    """The template's launch configs: HOPPER_CONFIGS shrunk to the product's sizes (tl.dot wants
    sides of at least 16), without repeats."""
    def side(block, size):
        return max(16, min(block, 1 << max(size - 1, 0).bit_length()))

    out = []
    for bm, bn, bk, warps, stages in HOPPER_CONFIGS:
        if g.ext.dtype == torch.float32:
            bk = max(16, bk // 2)
        cfg = {"XBLOCK": side(bm, g.m), "YBLOCK": side(bn, g.n), "BLOCK_K": side(bk, g.k),
               "num_warps": warps, "num_stages": stages}  # fmt: skip
        if cfg not in out:
            out.append(cfg)
    return out


def label(cfg: Optional[dict]) -> str:
    """A config as a short name ("extern" for the library call)."""
    if cfg is None:
        return "extern"
    return "template {XBLOCK}x{YBLOCK}x{BLOCK_K} w{num_warps} s{num_stages}".format(**cfg)


class GemmRenderer(TritonRenderer):
    """Renders a GemmKernel: the blocked product, then the epilogue members on its tile."""

    def _collect_args(self):
        k = self.kernel
        super()._collect_args()  # the epilogue's reads and stores
        kinds = {n: p.rstrip("0123456789") for n, p in self.args.items() if n != k.gemm.ext.name}
        kinds.update(dict.fromkeys(k.operands, "in_ptr"))
        ordered = [*k.operands, *(n for n in kinds if n not in k.operands)]
        if k.product is not None:
            ordered.insert(len(k.operands), k.product.name)
            kinds[k.product.name] = "out_ptr"
        self.args = {n: f"{kinds[n]}{i}" for i, n in enumerate(ordered)}

    def dtype_of(self, name) -> torch.dtype:
        if name == self.kernel.gemm.ext.name:
            return self.kernel.gemm.ext.dtype
        return super().dtype_of(name)

    def load(self, name, index):
        if name != self.kernel.gemm.ext.name:
            return super().load(name, index)
        if self.index_key(self.final_index(index)) != self._product_key:
            raise CantRender(f"{self.name}: the epilogue reads the product elsewhere ({index})")
        return self._product

    def render_config(self, cfg: dict) -> KernelSource:
        """The kernel for one launch config (its block sizes are in the source)."""
        k, g = self.kernel, self.kernel.gemm
        big = any(int(self.buffers[n].layout.storage_size()) >= 2**31 for n in self.args
                  if n in self.buffers)  # fmt: skip
        idx = ".to(tl.int64)" if big else ""
        bm, bn, bk = cfg["XBLOCK"], cfg["YBLOCK"], cfg["BLOCK_K"]
        tiles_m = -(-g.m // bm)
        p = {n: self.args[n] for n in k.operands}
        (oa, ob), (a_st, b_st) = g.ops, (g.ops[0].strides, g.ops[1].strides)
        head = ["pid_x = tl.program_id(0)", "pid_y = tl.program_id(1)"]
        if g.batch:
            head += [f"bidx = (pid_x // {tiles_m}){idx}", f"pid_m = pid_x % {tiles_m}",
                     "pid_n = pid_y"]  # fmt: skip
            a_b, b_b = f"bidx * {a_st[0]} + ", f"bidx * {b_st[0]} + "
        else:
            # programs in groups of GROUP_M tile rows, column by column: the tiles running at
            # once share their rows of A and columns of B in L2
            head += [f"pid = pid_y * {tiles_m} + pid_x", "tiles_n = tl.num_programs(1)",
                     f"width = {GROUP_M} * tiles_n", f"first_m = (pid // width) * {GROUP_M}",
                     f"group = tl.minimum({tiles_m} - first_m, {GROUP_M})",
                     "pid_m = first_m + (pid % width) % group",
                     "pid_n = (pid % width) // group"]  # fmt: skip
            a_b = b_b = ""
        sa, sb = a_st[-2:], b_st[-2:]
        precision = ""
        if g.ext.dtype == torch.float32:
            tf32 = torch.backends.cuda.matmul.allow_tf32  # eager's own choice for fp32 matmuls
            precision = ", input_precision=" + ('"tf32"' if tf32 else '"ieee"')
        k_mask = g.k % bk != 0
        # where the blocks divide the product, no tile has an edge: nothing is masked
        self._edge = ", mask" if g.m % bm or g.n % bn else ""
        # Triton's interpreter multiplies 16-bit floats as their bit patterns: it gets float32
        # (the products are exact in float32 either way, and the sum is float32 on the GPU too)
        up = ".to(tl.float32)" if _interpreting() and g.ext.dtype != torch.float32 else ""
        load_a, load_b = "tl.load(a_ptrs{})", "tl.load(b_ptrs{})"
        if k_mask:
            load_a = load_a.format(f", mask=rk[None, :] < {g.k} - kk, other=0.0")
            load_b = load_b.format(f", mask=rk[:, None] < {g.k} - kk, other=0.0")
        load_a, load_b = (self._converted(v, t.format(""), o, g.ext.dtype, up)
                          for v, t, o in (("a", load_a, oa), ("b", load_b, ob)))  # fmt: skip
        head += [
            f"rm = (pid_m * XBLOCK + tl.arange(0, XBLOCK)[:, None]){idx}",
            f"rn = (pid_n * YBLOCK + tl.arange(0, YBLOCK)[None, :]){idx}",
            *([f"mask = (rm < {g.m}) & (rn < {g.n})"] if self._edge else []),
            # rows and columns past the edge read row/column 0 again (never stored): no masks;
            # sides the blocks divide need no wrap, and Triton then sees their contiguous runs
            # (vector loads; a modulo hides them)
            f"ra = rm % {g.m}" if g.m % bm else "ra = rm",
            f"rb = rn % {g.n}" if g.n % bn else "rb = rn", f"rk = tl.arange(0, {bk}){idx}",
            f"a_ptrs = {p[oa.name]} + {oa.offset} + {a_b}ra * {sa[0]} + rk[None, :] * {sa[1]}",
            f"b_ptrs = {p[ob.name]} + {ob.offset} + {b_b}rk[:, None] * {sb[0]} + rb * {sb[1]}",
            "acc = tl.zeros([XBLOCK, YBLOCK], tl.float32)",
            f"for kk in range(0, {g.k}, {bk}):",
            *_indent([
                *load_a, *load_b,
                f"acc = tl.dot(a, b, acc{precision})",
                f"a_ptrs += {bk * sa[1]}", f"b_ptrs += {bk * sb[0]}",
            ]),
        ]  # fmt: skip
        value = "acc"
        if g.alpha != 1:
            value = f"{value} * {float(g.alpha)!r}"
        if g.bias is not None:
            bias = self._broadcast_index(g.bias, g)
            head.append(f"bias = tl.load({p[g.bias.name]} + {bias}{self._edge}).to(tl.float32)")
            value = f"{value} + bias" + (f" * {float(g.beta)!r}" if g.beta != 1 else "")
        # the product as the library returns it: rounded to its dtype, read back as float32
        if g.ext.dtype == torch.bfloat16 and _interpreting():
            value = _bf16_rne(f"({value})")
        elif g.ext.dtype != torch.float32:
            value = f"({value}).to({TL[g.ext.dtype]}).to(tl.float32)"
        head.append(f"prod = {value}")
        if k.product is not None:
            out = self._tile_index(_static(g.ext.layout.strides), g)
            name = k.product.name
            value = f"prod.to({TL[g.ext.dtype]})"
            head.append(f"tl.store({self.args[name]} + {out}, {value}{self._edge})")
        return self._with_epilogue(head, cfg, tiles_m)

    @staticmethod
    def _converted(var: str, load: str, o: Operand, dtype, up: str) -> list:
        """Lines loading an operand block into `var`, cast as its prologue says, in the dtype
        tl.dot takes."""
        if o.cast is None:
            return [f"{var} = {load}{up}"]
        if up and dtype == torch.bfloat16:  # the interpreter: rounded as the GPU rounds
            return [f"{var} = {load}", f"{var} = {_bf16_rne(var)}"]
        return [f"{var} = {load}.to({TL[dtype]}){up}"]

    def _tile_index(self, strides, g) -> str:
        rows, cols = strides[-2:]
        return (f"bidx * {strides[0]} + " if g.batch else "") + f"rm * {rows} + rn * {cols}"

    def _broadcast_index(self, bias: Buffer, g: Gemm) -> str:
        """bias's address for the tile's elements: its sizes align with the product's from the
        right, a size-1 (or missing) dim broadcast."""
        sizes, strides = _static(bias.layout.sizes), _static(bias.layout.strides)
        out_vars = (["bidx"] if g.batch else []) + ["rm", "rn"]
        terms = []
        for v, size, stride in zip(out_vars[::-1], sizes[::-1], strides[::-1]):
            if size != 1 and stride != 0:
                terms.append(f"{v} * {stride}")
        return " + ".join(terms) or "tl.zeros([XBLOCK, YBLOCK], tl.int32)"

    def _with_epilogue(self, head, cfg, tiles_m) -> KernelSource:
        k, g = self.kernel, self.kernel.gemm
        self.kernel_indices()  # (the kernel's ranges, which final_index simplifies within)
        names = (["bidx"] if g.batch else []) + ["rm", "rn"]
        tile = [sympy.Symbol(n, integer=True, nonnegative=True) for n in names]
        sizes = ([g.batch] if g.batch else []) + [g.m, g.n]
        self.ranges = dict(zip(tile, sizes))
        self.persistent, self.locals, self.deferred, self.mask_stack = False, {}, {}, []
        self.tile = ({*names[:-1]}, {names[-1]})
        self._product_key = self.index_key(sympy.expand(g.ext.layout.index(tile)))
        self._product = CSEVar("prod", torch.float32)
        self.uses_prod = False
        mask = "mask" if self._edge else ""
        body = self._body(k.members, tile, [], mask, x_level=True) if k.members else []
        params = [*self.args.values(), "xnumel", "ynumel", "XBLOCK: tl.constexpr",
                  "YBLOCK: tl.constexpr"]  # fmt: skip
        src = "\n".join(["import triton", "import triton.language as tl",
                         "from triton.language.extra import libdevice", "", "", "@triton.jit",
                         f"def {self.name}({', '.join(params)}):", *_indent(head + body),
                         ""])  # fmt: skip
        types = tuple(buffer_ptr_type(self.dtype_of(n)) for n in self.args) + ("i64", "i64")
        launch = {"XBLOCK": cfg["XBLOCK"], "YBLOCK": cfg["YBLOCK"], "num_warps": cfg["num_warps"],
                  "num_stages": cfg["num_stages"]}  # fmt: skip
        # programs along x: the tile rows of every batch; along y: the tile columns
        xnumel = max(g.batch, 1) * tiles_m * cfg["XBLOCK"]
        meta = (("xnumel", xnumel), ("rnumel", g.n), ("persistent", 0), ("reduction", 0),
                ("tiled", 1), ("columns", 0), ("template", label(cfg)),
                ("configs", (launch,)))  # fmt: skip
        out = KernelSource(self.name, "triton", src, tuple(self.args), types, meta=meta,
                           num_warps=cfg["num_warps"])  # fmt: skip
        return dataclasses.replace(out, grid=grid_of(out, launch))


def _kernel_for(g: Gemm, epilogue: Optional[Kernel], stored: bool, name: str) -> GemmKernel:
    product = g.ext if stored else None
    if epilogue is None:
        sizes = _static(g.ext.layout.sizes)
        return GemmKernel(name, sizes, (), phases=[([], [])], gemm=g, product=product)
    return GemmKernel(epilogue.name, epilogue.xsizes, (), members=list(epilogue.members),
                      stores=dict(epilogue.stores), roles=dict(epilogue.roles),
                      phases=list(epilogue.phases), local=set(epilogue.local), gemm=g,
                      product=product)  # fmt: skip


class _LoadRecorder(TextHandler):
    """A body's text, with its loads' buffers and indices."""

    def __init__(self):
        super().__init__()
        self.loads = []

    def load(self, name, index):
        self.loads.append((name, index))
        return super().load(name, index)


def cast_prologue(x: ComputedBuffer, dtype, producer: int) -> Optional[Operand]:
    """`x` read as its source when it is only a cast of one element of one buffer to `dtype` at an
    affine index (a weight cast under autocast, stored in the order it reads its source)."""
    if x.is_reduction():
        return None
    vs = loop_vars("i", len(x.ranges))
    with set_handler(_LoadRecorder()) as rec:
        x.body(vs)
    if len(rec.lines) != 3 or len(rec.loads) != 1 or "= to_dtype(tmp0, " not in rec.lines[1]:
        return None
    if not rec.lines[1].endswith(f", {str(dtype).removeprefix('torch.')})"):
        return None
    name, index = rec.loads[0]
    index = sympy.expand(index)
    steps = unit_steps(index, vs, vs)
    offset = sympy.sympify(index.xreplace({v: 0 for v in vs}))
    if steps is None or not offset.is_Integer:
        return None
    if sympy.expand(offset + sum(st * v for st, v in zip(steps, vs)) - index) != 0:
        return None  # not affine (a reshape's div/mod): read through the stored cast
    return Operand(name, int(offset), tuple(steps), cast=dtype, producer=producer)


def _prologues(g: Gemm, steps, readers, i: int, output_names, taken: set) -> tuple:
    """g's operands, each read through its cast's source where the cast's own kernel computes
    only it, for this product alone."""
    ops = list(g.ops)
    for pos, x in enumerate((g.a, g.b)):
        if not isinstance(x, ComputedBuffer) or x.name in output_names:
            continue
        producers = [j for j, s in enumerate(steps[:i])
                     if isinstance(s, Kernel) and x.name in s.names]  # fmt: skip
        if len(producers) != 1 or readers.get(x.name) != [i] or producers[0] in taken:
            continue  # read elsewhere too, or an earlier product's epilogue
        k = steps[producers[0]]
        if k.names != [x.name] or k.rsizes or isinstance(k, GemmKernel):
            continue
        cast = cast_prologue(x, g.ext.dtype, producers[0])
        if cast is not None and (len(cast.strides) == len(ops[pos].strides)):
            ops[pos] = cast
    return tuple(ops)


def plan(steps: list, output_names) -> list[tuple]:
    """(extern step index, Gemm, epilogue step index or None, whether the product is stored)
    for every extern step a template can replace."""
    from .scheduler import _step_reads

    readers: dict[str, list] = {}
    for j, s in enumerate(steps):
        for name in _step_reads(s):
            readers.setdefault(name, []).append(j)
    taken, out = set(), []
    for i, s in enumerate(steps):
        g = as_gemm(s)
        if g is None:
            continue
        users = readers.get(g.ext.name, [])
        first = users[0] if users else None
        epilogue = None
        if first is not None and first not in taken and isinstance(steps[first], Kernel):
            if takes_epilogue(g, steps[first]):
                epilogue = first
                taken.add(first)
        others = [j for j in users if j != epilogue]
        stored = g.ext.name in output_names or bool(others)
        g.ops = _prologues(g, steps, readers, i, output_names, taken)
        out.append((i, g, epilogue, stored))
    return out


def render_candidates(gk: GemmKernel, buffers: dict) -> list[KernelSource]:
    """The template kernel for every config (a config that cannot render is left out)."""
    out = []
    for cfg in gemm_configs(gk.gemm):
        try:
            out.append(GemmRenderer(gk, buffers, gk.name).render_config(cfg))
        except CantRender as e:
            log.debug("matmul template %s not rendered: %s", label(cfg), e)
    return out


__all__ = ["GemmKernel", "GemmRenderer", "as_gemm", "gemm_configs", "plan", "render_candidates",
           "takes_epilogue"]  # fmt: skip


def enabled(device: str) -> bool:
    """Whether matmuls may become templates here: config.max_autotune_gemm, on a device whose
    kernels are Triton's (CUDA; the CPU only through the interpreter, with gemm_force set)."""
    if not config.max_autotune_gemm or config.gemm_force == "extern":
        return False
    if device.startswith("cuda"):
        return True
    forced = isinstance(config.gemm_force, int) or config.gemm_force == "measure"
    return config.cpu_backend == "triton" and forced


def choose_templates(steps: list, buffers: dict, output_names, device: str) -> list:
    """`steps` with each matmul that a template (with its epilogue) beats, by measurement or by
    config.gemm_force, replaced by its GemmKernel (at its epilogue's place, else its own)."""
    replace, drop, candidates = {}, set(), []
    for i, g, j, stored in plan(steps, set(output_names)):
        epilogue = steps[j] if j is not None else None
        gk = _kernel_for(g, epilogue, stored, epilogue.name if epilogue else f"gemm_{g.ext.name}")
        sources = render_candidates(gk, buffers)
        if sources:
            candidates.append((i, j, gk, sources, epilogue))
    chosen = _choose_all(candidates, steps, buffers, device)
    for (i, j, gk, _, _), source in zip(candidates, chosen):
        if source is None:
            continue
        gk.source = source
        replace[j if j is not None else i] = gk
        if j is not None:
            drop.add(i)
        drop.update(o.producer for o in gk.gemm.ops if o.producer is not None)
    if not replace:
        return steps
    metrics.gemm_templates += len(replace)
    return [replace.get(i, s) for i, s in enumerate(steps) if i not in drop]


def _choose_all(candidates: list, steps, buffers, device) -> list:
    """For each (extern index, epilogue index, GemmKernel, sources, epilogue kernel): the template
    source to use, or None to keep the library call; every matmul timed in one worker."""
    force = config.gemm_force
    if isinstance(force, int):
        return [sources[min(force, len(sources) - 1)] for _, _, _, sources, _ in candidates]
    if not candidates or (not device.startswith("cuda") and force != "measure"):
        return [None] * len(candidates)  # nothing to time the candidates on
    from . import autotune

    problems = [_problem(gk, sources, epilogue, steps, buffers, device)
                for _, _, gk, sources, epilogue in candidates]  # fmt: skip
    try:
        results = autotune.pick_many(problems, device)
    except OSError as e:
        log.warning("ember.inductor: matmuls keep the library call (%s)", e)
        return [None] * len(candidates)
    out = []
    for (_, _, gk, sources, _), result in zip(candidates, results):
        ext = gk.gemm.ext
        if isinstance(result, Exception):
            log.warning("ember.inductor: matmul %s keeps the library call (%s)", ext.name, result)
            out.append(None)
            continue
        best, times = result
        timed = [f"{k} {v:.4f} ms" if v is not None else f"{k} failed" for k, v in times.items()]
        log.info("ember.inductor: matmul %s %s: %s", ext.name,
                 "x".join(map(str, ext.layout.sizes)), ", ".join(timed))  # fmt: skip
        out.append(None if best == 0 else sources[best - 1])
    return out


def _problem(gk: GemmKernel, sources: list, epilogue, steps, buffers, device) -> tuple:
    """autotune's (choices, tensors) for one matmul: the library call first (with the kernels
    it needs around it), then each template source."""
    from . import autotune
    from .pipeline import render_kernels

    tensors, choices = {}, []

    def use(name):
        tensors.setdefault(name, autotune.tensor_spec(buffers[name].layout))
        return name

    ext = gk.gemm.ext
    args = [{"tensor": use(a.name)} if isinstance(a, Buffer) else a for a in ext.args]
    baseline = [{"kind": "extern", "op": ext.op, "args": args, "kwargs": dict(ext.kwargs)}]
    # the operands' casts, the call, then the epilogue's own kernel, as they would run
    around = [steps[o.producer] for o in gk.gemm.ops if o.producer is not None]
    for k in around:
        baseline.insert(0, _triton_launch(render_kernels([k], buffers, device)[k.name], use))
    if epilogue is not None:
        src = render_kernels([epilogue], buffers, device)[epilogue.name]
        baseline.append(_triton_launch(src, use))
    choices.append(autotune.Choice("extern", baseline))
    for src in sources:
        choices.append(autotune.Choice(dict(src.meta)["template"], [_triton_launch(src, use)]))
    return choices, tensors


def _triton_launch(src: KernelSource, use) -> dict:
    """A kernel as autotune's worker launches it: with every launch config it would try."""
    meta = dict(src.meta)
    second = meta["reduction"] or meta.get("tiled")
    sizes = [int(meta["xnumel"])] + ([int(meta["rnumel"])] if second else [])
    return {"kind": "triton", "source": src.source, "name": src.name,
            "args": [use(a) for a in src.args], "sizes": sizes,
            "cfgs": [dict(c) for c in meta["configs"]]}  # fmt: skip
