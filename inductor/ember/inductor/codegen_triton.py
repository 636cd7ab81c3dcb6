"""The Triton renderer: the same kernel IR as C++, as block programs over x (and r) indices.

Pointwise kernels are one-dimensional over the flattened x space, or [XBLOCK, YBLOCK] tiles over
(outer, inner) dims when one access walks memory along an outer dim and another along the innermost
(a transpose: see `_tile_split`); reductions are two-dimensional [XBLOCK, RBLOCK] blocks, persistent
(one block holds the whole row) when rows are short, else looped over r. Loads and stores are
masked; indices are 64-bit when a buffer needs it.
"""

from __future__ import annotations

import math
import os
from typing import Optional

import sympy
import torch

from ember.ir import CeilDiv
from ember.ir.symbols import free_symbols_of

from .codegen_common import (
    CantRender,
    PY_MINMAX,
    TRITON_MINMAX,
    CSEVar,
    KernelSource,
    Renderer,
    buffer_ptr_type,
    merge_dims,
    print_index,
    simplify_index,
    _paren,
    size_symbols_in,
)
from .config import config
from .loop_ir import compute_dtype
from .scheduler import persistent, unit_steps, walks_columns

TL = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16", torch.int64: "tl.int64", torch.int32: "tl.int32",
    torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
    torch.uint16: "tl.uint16", torch.uint32: "tl.uint32", torch.uint64: "tl.uint64",
}  # fmt: skip
NAN_ALL = "propagate_nan=tl.PropagateNan.ALL"
OPS = {
    "neg": "-{0}", "abs": "tl.abs({0})", "exp": "tl.exp({0})", "exp2": "tl.exp2({0})",
    "expm1": "libdevice.expm1({0})", "log": "tl.log({0})", "log1p": "libdevice.log1p({0})",
    "log2": "tl.log2({0})", "log10": "libdevice.log10({0})", "sqrt": "tl.sqrt({0})",
    "rsqrt": "tl.rsqrt({0})", "sin": "tl.sin({0})", "cos": "tl.cos({0})", "tan": "libdevice.tan({0})",
    "tanh": "libdevice.tanh({0})", "asin": "libdevice.asin({0})", "acos": "libdevice.acos({0})",
    "atan": "libdevice.atan({0})", "sinh": "libdevice.sinh({0})", "cosh": "libdevice.cosh({0})",
    "asinh": "libdevice.asinh({0})", "acosh": "libdevice.acosh({0})", "atanh": "libdevice.atanh({0})",
    "erf": "tl.erf({0})", "erfc": "libdevice.erfc({0})", "erfinv": "libdevice.erfinv({0})",
    "lgamma": "libdevice.lgamma({0})", "reciprocal": "1.0 / {0}", "floor": "tl.floor({0})",
    "ceil": "tl.ceil({0})", "trunc": "libdevice.trunc({0})", "round": "libdevice.nearbyint({0})",
    "sign": "(({0} > 0).to({t}) - ({0} < 0).to({t}))", "signbit": "{0}.to({bits}, bitcast=True) < 0",
    "isnan": "{0} != {0}", "isinf": "tl.abs({0}) == float('inf')",
    "isfinite": "tl.abs({0}) < float('inf')", "logical_not": "{0} == 0", "bitwise_not": "~{0}",
    "sigmoid": "tl.sigmoid({0})", "relu": f"tl.maximum({{0}}, 0.0, {NAN_ALL})",
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "truediv": "{0} / {1}",
    "floordiv": "tl.where(({0} % {1} != 0) & (({0} < 0) != ({1} < 0)), {0} // {1} - 1, {0} // {1})",
    "truncdiv": "{0} // {1}", "fmod": "libdevice.fmod({0}, {1})",
    "remainder": "tl.where(({0} % {1} != 0) & (({0} % {1} < 0) != ({1} < 0)), {0} % {1} + {1}, {0} % {1})",
    "maximum": f"tl.maximum({{0}}, {{1}}, {NAN_ALL})", "minimum": f"tl.minimum({{0}}, {{1}}, {NAN_ALL})",
    "pow": "libdevice.pow({0}, {1})", "atan2": "libdevice.atan2({0}, {1})",
    "hypot": "libdevice.hypot({0}, {1})", "eq": "{0} == {1}", "ne": "{0} != {1}", "lt": "{0} < {1}",
    "le": "{0} <= {1}", "gt": "{0} > {1}", "ge": "{0} >= {1}", "logical_and": "({0} != 0) & ({1} != 0)",
    "logical_or": "({0} != 0) | ({1} != 0)", "logical_xor": "({0} != 0) ^ ({1} != 0)",
    "bitwise_and": "{0} & {1}", "bitwise_or": "{0} | {1}", "bitwise_xor": "{0} ^ {1}",
    "shift_left": "{0} << {1}", "shift_right": "{0} >> {1}",
    # uint32 words, zero-extended
    "philox": "tl.randint({0}, {1}).to(tl.int64)",
}  # fmt: skip
# Triton's CPU interpreter has no libdevice: these spell the common ones with tl ops instead.
INTERPRET_OPS = {
    "tanh": "tl.where({0} < 0, -1.0, 1.0) * (1.0 - tl.exp(-2.0 * tl.abs({0}))) / (1.0 + tl.exp(-2.0 * tl.abs({0})))",
    "expm1": "tl.exp({0}) - 1.0", "log1p": "tl.log(1.0 + {0})", "log10": "tl.log({0}) * 0.4342944819032518",
    "tan": "tl.sin({0}) / tl.cos({0})", "trunc": "tl.where({0} < 0, tl.ceil({0}), tl.floor({0}))",
    # exp(log|a| * b), with pow's signs and special cases: a negative base takes an integer
    # exponent (negated for an odd one) and gives NaN for any other; a^0 = 1^b = 1, even NaN.
    "pow": "tl.where({0} == 1, 1.0, tl.where({1} == 0, 1.0, tl.where({0} < 0, tl.where(tl.floor({1}) == {1}, tl.where(tl.floor({1} * 0.5) * 2.0 != {1}, -1.0, 1.0), float('nan')), 1.0) * tl.exp(tl.log(tl.abs({0})) * {1})))",
    "fmod": "{0} - {1} * tl.where({0} / {1} < 0, tl.ceil({0} / {1}), tl.floor({0} / {1}))",
}  # fmt: skip
PROD_COMBINE = "_ember_mul"
REDUCE = {"sum": ("0", "tl.sum({0}, 1)[:, None]", "{0} + {1}"),
          "max": ("float('-inf')", "tl.max({0}, 1)[:, None]", f"tl.maximum({{0}}, {{1}}, {NAN_ALL})"),
          "min": ("float('inf')", "tl.min({0}, 1)[:, None]", f"tl.minimum({{0}}, {{1}}, {NAN_ALL})"),
          # a looped any's accumulator stays int1: where(mask, flag, 0) is an int32
          "any": ("0", "tl.max({0}.to(tl.int32), 1)[:, None] != 0", "{0} | ({1} != 0)"),
          # Triton has no product: tl.reduce with a multiply the kernel's module defines
          "prod": ("1", f"tl.reduce({{0}}, 1, {PROD_COMBINE})[:, None]", "{0} * {1}")}  # fmt: skip


def _integer_extreme(rtype: str, dtype) -> Optional[str]:
    """A max/min's start value for integers and bools (their lowest or highest value): a float
    infinity does not convert to an integer (the interpreter raises OverflowError)."""
    if rtype not in ("max", "min") or dtype is None or dtype.is_floating_point:
        return None
    if dtype == torch.bool:
        return "0" if rtype == "max" else "1"
    info = torch.iinfo(dtype)
    # written as a difference: the literal -2**63 would be parsed as -(2**63), out of int64
    return f"({info.min + 1} - 1)" if rtype == "max" else str(info.max)


def tl_constant(value, dtype) -> str:
    if dtype == torch.bool:
        return "1" if value else "0"
    if dtype.is_floating_point:
        v = float(value)
        return f"float('{v}')" if not math.isfinite(v) else repr(v)
    return f"tl.full([1], {int(value)}, {TL[dtype]})"


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


class TritonRenderer(Renderer):
    language = "triton"
    block_values = True
    hints: dict = {}  # dynamic size symbol -> its example value (render_kernels sets it)

    def assign(self, var, text):
        return f"{var} = {text}"

    def _mask(self):
        parts = [self.base_mask] + [str(m) for m in self.mask_stack]
        return " & ".join(p for p in parts if p)

    def load(self, name, index):
        index = self.final_index(index)
        key = ("load", name, self.index_key(index))
        if key in self.cse:
            return self.cse[key]
        if key in self.locals:
            return self.locals[key]
        if name in self.kernel.local:  # never stored: a read must come from a register
            raise RuntimeError(
                f"ember.inductor: {self.name} reads {name}, which it keeps in registers, at an "
                f"index it did not compute ({index}); please report this"
            )
        dtype = self.dtype_of(name)
        other = ", other=0.0" if self.mask_stack or self.kernel.rsizes else ""
        ptr, mask = f"{self.args[name]} + ({self.index_text(index)})", self._mask()
        if mask and not (free_symbols_of(index) - set(self.hints)):
            # An index that depends on no block variable gives a scalar pointer, which Triton
            # will not load under a block mask: broadcast it to the mask's shape.
            ptr += f" + 0 * ({mask}).to(tl.int32)"
        text = f"tl.load({ptr}, {mask}{other})"
        if dtype in (torch.float16, torch.bfloat16):
            text += ".to(tl.float32)"
        return self.emit(text, compute_dtype(dtype), key=key)

    def store(self, name, index, value, mask=None):
        index = self.final_index(index)
        key = ("load", name, self.index_key(index))
        if isinstance(value, _Pending):
            assert mask is None, "a reduction's value stored under a mask"  # (_phase drops it)
            self.deferred[name] = (index, value)
            return
        if mask is None:  # (a masked store's element may not be there to read back)
            self.cse[key] = value
            if self.at_x_level or self.persistent:
                self.locals[key] = value
        if name not in self.kernel.local:
            where = self._mask()
            if mask is not None:
                where = f"({where}) & ({mask})" if where else str(mask)
            self.lines.append(self._store_line(name, index, value, where))

    def _store_line(self, name, index, value, mask):
        dtype = self.dtype_of(name)
        v = (
            f"{value}.to({TL[dtype]})"
            if dtype != value.dtype or dtype in (torch.float16, torch.bfloat16)
            else str(value)
        )
        if dtype == torch.bfloat16 and _interpreting():
            v = f"{_bf16_rne(value)}.to(tl.bfloat16)"
        ptr = f"{self.args[name]} + ({self.index_text(index)})"
        names = {str(s)[0] for s in free_symbols_of(index) - set(self.hints)}
        if self.tile is not None:
            used = {str(v) for v in free_symbols_of(index)}
            if not (used & self.tile[0] and used & self.tile[1]):
                # an address over one side of the tile (a broadcast row or column) is
                # broadcast to the [XBLOCK, YBLOCK] block its mask covers
                ptr += " + tl.zeros([XBLOCK, YBLOCK], tl.int32)"
        elif "rmask" in mask and not {"x", "r"} <= names:
            # In a reduction's r loop the mask is an [XBLOCK, RBLOCK] block, but an address
            # over x alone (a pointwise member fused into the loop, or an r range of 1 merged
            # away) is [XBLOCK, 1] and one over r alone [1, RBLOCK]: tl.store takes no mask
            # wider than its pointer, so the address is broadcast to the whole block.
            ptr += " + tl.zeros([XBLOCK, RBLOCK], tl.int32)"
        elif not names:
            # A scalar pointer takes no block value or mask: broadcast it to the value's shape,
            # and to the mask's (the value may be a constant: a 0-d tensor filled with zeros).
            ptr += f" + tl.zeros({value}.shape, tl.int32)"
            if mask:
                ptr += f" + tl.zeros(({mask}).shape, tl.int32)"
        return f"tl.store({ptr}, {v}, {mask})"

    def constant(self, value, dtype):
        return self.emit(tl_constant(value, compute_dtype(dtype)), compute_dtype(dtype))

    def index_expr(self, expr, dtype):
        text = self.index_text(self.final_index(expr))
        return self.emit(
            f"({text}) + tl.zeros([1], {TL[compute_dtype(dtype)]})", compute_dtype(dtype)
        )

    def to_dtype(self, value, dtype):
        if dtype == torch.bool:
            return self.emit(f"{value} != 0", torch.bool)
        if dtype in (torch.float16, torch.bfloat16):
            if value.dtype.itemsize == 8 and os.environ.get("TRITON_INTERPRET") == "1":
                # Triton 3.6's interpreter turns 64-bit values into garbage 16-bit floats (125
                # as 1e-38, -1.0 as NaN); the compiler converts them directly.
                value = self.emit(f"{value}.to(tl.float32)", torch.float32)
            if dtype == torch.bfloat16 and _interpreting():
                return self.emit(_bf16_rne(value), torch.float32)
            return self.emit(f"{value}.to({TL[dtype]}).to(tl.float32)", torch.float32)
        return self.emit(f"{value}.to({TL[dtype]})", dtype)

    def where(self, cond, a, b):
        return self.emit(f"tl.where({cond}, {a}, {b})", a.dtype)

    def op_text(self, name, args):
        t = TL.get(args[0].dtype, "tl.float32")
        if os.environ.get("TRITON_INTERPRET") == "1":
            if name in INTERPRET_OPS:
                return INTERPRET_OPS[name].format(*args)
            if OPS[name].startswith("libdevice."):
                raise NotImplementedError(
                    f"{name}: Triton's interpreter has no libdevice ({OPS[name].split('(')[0]})"
                )
        if name == "signbit":  # the sign bit itself: -0.0 and NaNs with it set are included
            if not args[0].dtype.is_floating_point:
                return f"{args[0]} < 0"
            return OPS[name].format(*args, bits="tl.int64" if t == "tl.float64" else "tl.int32")
        return OPS[name].format(*args, t=t)

    def masked(self, mask, body, other):
        first_local, first_line = next(self._ids), len(self.lines)
        self.mask_stack.append(mask)
        saved = dict(self.cse)
        try:
            result = body()
        finally:
            self.mask_stack.pop()
            self.cse = saved
        text = f"tl.where({mask}, {result}, {tl_constant(other, result.dtype)})"
        if result.dtype == torch.bool:  # a bool constant is a Python int: keep an int1 value
            text = f"({text} != 0)"
        key = self.masked_key(first_local, "\n".join(self.lines[first_line:] + [text]))
        if key in self.cse:  # the same masked read rendered before: drop this copy's lines
            del self.lines[first_line:]
            return self.cse[key]
        return self.emit(text, result.dtype, key=key)

    def indirect_indexing(self, value, size):
        var = self.emit(f"{value}.to(tl.int64)", torch.int64)
        var2 = self.emit(f"tl.where({var} < 0, {var} + {size}, {var})", torch.int64)
        return sympy.Symbol(str(var2), integer=True)

    def reduction(self, dtype, src_dtype, rtype, value):
        j = len(self.reds)
        self.reds.append((rtype, dtype))
        out = _Pending(f"red{self.phase}_{j}", compute_dtype(dtype))
        if rtype == "prod":
            self.uses_prod = True
        if rtype in ("argmax", "argmin"):
            fill = "float('-inf')" if rtype == "argmax" else "float('inf')"
            masked = self.emit(f"tl.where({self._mask()}, {value}, {fill})", value.dtype)
            if self.persistent:
                self.lines.append(f"{out} = tl.{rtype}({masked}, 1)[:, None].to(tl.int64)")
            else:
                self._looped_arg_reduction(rtype, out, masked, fill, j)
            return out
        init, final, combine = REDUCE[rtype]
        init = _integer_extreme(rtype, src_dtype or dtype) or init
        masked = self.emit(f"tl.where({self._mask()}, {value}, {init})", value.dtype)
        if self.persistent:
            self.lines.append(f"{out} = {final.format(masked)}")
        else:
            acc = f"acc{self.phase}_{j}"
            self.pre.append(
                f"{acc} = tl.full([XBLOCK, RBLOCK], {init}, {TL[compute_dtype(dtype)]})"
            )
            self.lines.append(f"{acc} = {combine.format(acc, masked)}")
            self.post.append(f"{out} = {final.format(acc)}")
        return out

    def _looped_arg_reduction(self, rtype, out, masked, fill, j):
        """argmax/argmin over a row longer than one block: each lane keeps the best value it
        has seen and where (a later chunk replaces it only when strictly better, or NaN over a
        number, as torch ranks NaN above all), then the lanes agree on the best value and take
        the smallest index holding it: torch's first occurrence."""
        val, idx = f"acc{self.phase}_{j}", f"idx{self.phase}_{j}"
        better = ">" if rtype == "argmax" else "<"
        acc_type = "tl.float64" if masked.dtype == torch.float64 else "tl.float32"
        self.pre += [f"{val} = tl.full([XBLOCK, RBLOCK], {fill}, {acc_type})",
                     f"{idx} = tl.zeros([XBLOCK, RBLOCK], tl.int64)"]  # fmt: skip
        take = self.emit(
            f"({masked} {better} {val}) | (({masked} != {masked}) & ({val} == {val}))", torch.bool
        )
        self.lines += [f"{idx} = tl.where({take}, rindex.to(tl.int64), {idx})",
                       f"{val} = tl.where({take}, {masked}, {val})"]  # fmt: skip
        pick = "tl.max" if rtype == "argmax" else "tl.min"
        self.post += [
            f"{val}_nan = tl.max(({val} != {val}).to(tl.int32), 1)[:, None] != 0",
            f"{val}_best = {pick}(tl.where({val} != {val}, {fill}, {val}), 1)[:, None]",
            f"{val}_here = tl.where({val}_nan, {val} != {val}, {val} == {val}_best)",
            f"{out} = tl.min(tl.where({val}_here, {idx}, 9223372036854775807), 1)[:, None]",
        ]

    # --- structure ------------------------------------------------------------------------------
    def index_text(self, expr):
        return _py(simplify_index(expr, self.ranges))

    def _decompose(self, flat, vars_, sizes):
        lines = []
        for j, (v, s) in enumerate(zip(vars_, sizes)):
            inner = sympy.Mul(*sizes[j + 1 :])
            # Sizes may be products of symbols: `x // (s1 * s1)`, never `x // s1 * s1`.
            e = f"{flat} // {_paren(_py(inner), sympy.sympify(inner))}" if inner != 1 else flat
            lines.append(f"{v} = {e}" + (f" % {_paren(_py(s), sympy.sympify(s))}" if j else ""))
        return lines

    def render(self) -> KernelSource:
        k = self.kernel
        self.uses_prod = False  # a product reduction needs its combine function in the module
        xs, rs, exprs = self.kernel_indices()
        xsizes, xvars, xassign = merge_dims(k.xsizes, xs, exprs)
        rsizes, rvars, rassign = merge_dims(k.rsizes, rs, exprs)
        self.ranges = dict(zip(xvars + rvars, xsizes + rsizes))
        xnumel, rnumel = sympy.Mul(*xsizes), sympy.Mul(*rsizes)
        dynamic = not (xnumel.is_Integer and rnumel.is_Integer)
        # Dynamic sizes: 64-bit offsets (any size may be large), loops over rnumel when it varies.
        big = dynamic or (
            any(int(self.buffers[n].layout.storage_size()) >= 2**31 for n in self.args)
            or xnumel * rnumel >= 2**31
        )
        # The scheduler plans registers by the same rule, over the kernel's own r sizes: merged
        # ones drop size-1 dims, and a row of (1, 1) merged to () would read as no row at all.
        self.persistent = persistent(k)
        columns = bool(k.rsizes) and not self.persistent and walks_columns(k)
        self.locals, self.deferred, self.mask_stack = {}, {}, []
        reduction = bool(k.rsizes)
        pid = "tl.program_id(0).to(tl.int64)" if big else "tl.program_id(0)"
        split = None if reduction or dynamic else _tile_split(xvars, xsizes, self._accesses(xassign))
        self.tile = None
        if split is not None:  # [XBLOCK, YBLOCK] tiles: outer dims down, inner dims across
            self.tile = ({str(v) for v in xvars[:split]}, {str(v) for v in xvars[split:]})
            pid_y = "tl.program_id(1).to(tl.int64)" if big else "tl.program_id(1)"
            head = [f"xoffset = {pid} * XBLOCK", "xindex = xoffset + tl.arange(0, XBLOCK)[:, None]",
                    "xmask = xindex < xnumel", f"yoffset = {pid_y} * YBLOCK",
                    "yindex = yoffset + tl.arange(0, YBLOCK)[None, :]", "ymask = yindex < ynumel",
                    *self._decompose("xindex", xvars[:split], xsizes[:split]),
                    *self._decompose("yindex", xvars[split:], xsizes[split:])]  # fmt: skip
            xnumel, rnumel = sympy.Mul(*xsizes[:split]), sympy.Mul(*xsizes[split:])
            body = self._body(k.members, xassign, [], "xmask & ymask", x_level=True)
        else:
            xshape = "[:, None]" if reduction else ""
            head = [f"xoffset = {pid} * XBLOCK", f"xindex = xoffset + tl.arange(0, XBLOCK){xshape}",
                    "xmask = xindex < xnumel", *self._decompose("xindex", xvars, xsizes)]  # fmt: skip
            if not reduction:
                body = self._body(k.members, xassign, [], "xmask", x_level=True)
            else:
                body = ["rbase = tl.arange(0, RBLOCK)[None, :]"]
                for i, (loop_members, post) in enumerate(k.phases):
                    body += self._phase(i, loop_members, post, xassign, rassign, rvars, rsizes)
        # Dynamic sizes (in the body or the numels) are arguments after xnumel and rnumel.
        syms = size_symbols_in([*head, *body, _py(xnumel), _py(rnumel)])
        tiled = split is not None
        if not dynamic:
            # A static size that is no multiple of 16 as a constant, shadowing the launch's
            # argument: Triton then knows a mask's runs (196 = 4 x 49: four-wide loads and
            # stores), which such an argument hides (ResMLP's transposing kernel stored one
            # element at a time, at twice a copy's time). Multiples of 16 stay arguments, which
            # Triton specializes as such: one kernel serves every size of the same body.
            second = ["ynumel"] if tiled else ["rnumel"] if reduction else []
            head = [f"{v} = {int(n)}" for v, n in zip(["xnumel", *second], (xnumel, rnumel))
                    if int(n) % 16] + head  # fmt: skip
        params = ([*self.args.values(), "xnumel"] + (["rnumel"] if reduction else [])
                  + (["ynumel"] if tiled else []) + syms)  # fmt: skip
        consts = (["XBLOCK: tl.constexpr"] + (["RBLOCK: tl.constexpr"] if reduction else [])
                  + (["YBLOCK: tl.constexpr"] if tiled else []))  # fmt: skip
        helpers = []
        if self.uses_prod:
            helpers = ["@triton.jit", f"def {PROD_COMBINE}(a, b):", "    return a * b", "", ""]
        src = "\n".join([
            "import triton", "import triton.language as tl",
            "from triton.language.extra import libdevice", "", "", *helpers, "@triton.jit",
            f"def {self.name}({', '.join(params + consts)}):", *_indent(head + body), "",
        ])  # fmt: skip
        types = tuple(buffer_ptr_type(self.dtype_of(n)) for n in self.args) + ("i64",) * (
            1 + reduction + tiled + len(syms)
        )
        # a tiled kernel's second size (ynumel) travels where a reduction's rnumel does
        meta = (("xnumel", self._hint(xnumel)), ("rnumel", self._hint(rnumel)),
                ("persistent", int(self.persistent)), ("reduction", int(reduction)),
                ("tiled", int(tiled)), ("columns", int(columns)))  # fmt: skip
        if dynamic:  # the wrapper computes the numels from the sizes at each call
            meta += (("numel", (_py(xnumel, PY_MINMAX), _py(rnumel, PY_MINMAX))),)
        return KernelSource(self.name, "triton", src, (*self.args, *syms), types, meta=meta)

    def _accesses(self, xassign) -> list:
        """Every load and store index of the kernel, in the rendered (merged) x variables."""
        kxs, _ = self.kernel.vars()
        subst = dict(zip(kxs, xassign))
        out = []
        for m in self.kernel.members:
            rec = self.kernel.record(m)
            for _, index in rec.loads + rec.stores:
                out.append(sympy.sympify(simplify_index(index, self.kernel_ranges)).xreplace(subst))
        return out

    def _hint(self, expr) -> int:
        """`expr` at the example's sizes (block sizes are chosen for it; any size runs)."""
        return int(expr.xreplace(self.hints)) if free_symbols_of(expr) else int(expr)

    def _body(self, members, xassign, rassign, mask, x_level=False, keep_cse=False):
        self.lines, self.base_mask, self.at_x_level = [], mask, x_level
        self.cse = self.cse if keep_cse else {}
        self.reds, self.pre, self.post = [], [], []
        self.run_members(members, xassign, rassign)
        return self.lines

    def _phase(self, i, loop_members, post, xassign, rassign, rvars, rsizes):
        self.phase = i
        # a persistent row stays in registers: later phases reuse earlier loads and values
        loop = self._body(
            loop_members, xassign, rassign, "xmask & rmask", keep_cse=self.persistent and i > 0
        )
        pre, fin = self.pre, self.post
        rhead = ["rmask = rindex < rnumel", *self._decompose("rindex", rvars, rsizes)]
        if self.persistent:
            lines = (["rindex = rbase", *rhead] if i == 0 else []) + loop
        else:
            lines = pre + [f"for roffset in range(0, {_py(sympy.Mul(*rsizes))}, RBLOCK):",
                           *_indent(["rindex = roffset + rbase", *rhead, *loop]), *fin]  # fmt: skip
        for name, (index, value) in self.deferred.items():
            # resolved now: an epilogue that stores this value again stores it at once
            self.locals[("load", name, self.index_key(index))] = CSEVar(value.name, value.dtype)
            if name not in self.kernel.local:
                lines.append(self._store_line(name, index, value, "xmask"))
        self.deferred = {}
        if post:
            saved = self.cse
            lines += self._body(post, xassign, [sympy.S.Zero] * len(rassign), "xmask", x_level=True)
            self.cse = saved  # x-level values are reachable again through self.locals
        return lines


class _Pending(CSEVar):
    """A reduction result: stores of it happen after its loop."""


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _bf16_rne(value) -> str:
    """`value` rounded to the nearest bfloat16 (ties to even), as a float32: Triton's CPU
    interpreter converts float32 to bfloat16 by dropping the low 16 bits (toward zero), where
    the GPU (and eager) round to nearest. Adding 0x7FFF plus the lowest kept bit carries into
    the kept bits exactly when the dropped ones are above half, or half with the kept bit odd;
    infinities stay. A NaN is kept as it is (its payload could carry into the sign bit)."""
    v = f"{value}.to(tl.float32)"
    bits = f"{v}.to(tl.uint32, bitcast=True)"
    rounded = f"(({bits} + 0x7FFF + (({bits} >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)"
    return f"tl.where({v} != {v}, {v}, {rounded})"


def _indent(lines):
    return ["    " + line for line in lines]


def _py(expr, minmax=TRITON_MINMAX) -> str:
    """An index or size in a kernel (minmax=PY_MINMAX: in the wrapper's Python)."""
    return print_index(sympy.sympify(expr), floordiv="//", mod="%", minmax=minmax)


# Elements a thread computes in a kernel that draws random numbers: Triton unrolls the ten Philox
# rounds per element, and a persistent reduction of 8 rows of 1024 on 2 warps (128 a thread)
# made ptxas run for minutes (GPT-2's dropout fused into its LayerNorm).
RANDOM_PER_THREAD = 16


def launch_configs(src: KernelSource) -> list[dict]:
    """Candidate block sizes and warps for autotuning (the first is the untuned default)."""
    configs = _launch_configs(src)
    if "tl.randint(" not in src.source:
        return configs
    capped = []
    for cfg in configs:
        cfg = dict(cfg)
        threads = 32 * cfg["num_warps"]
        inner = cfg.get("RBLOCK", cfg.get("YBLOCK", 1))
        while cfg["XBLOCK"] > 1 and cfg["XBLOCK"] * inner > RANDOM_PER_THREAD * threads:
            cfg["XBLOCK"] //= 2
        if cfg not in capped:
            capped.append(cfg)
    return capped


def _launch_configs(src: KernelSource) -> list[dict]:
    """The candidates of `launch_configs`: with config.autotune_wide the wide set, else two (three
    for short persistent rows) of them, the wide set's first among them (config.autotune_wide
    says how they were picked)."""
    meta = dict(src.meta)
    x, r = meta["xnumel"], meta["rnumel"]
    wide = config.autotune_wide
    if meta.get("tiled"):
        def side(n, cap):
            return max(1, min(cap, next_pow2(n)))

        shapes = ((32, 32, 4), (64, 64, 8)) + (((16, 64, 4), (64, 16, 4)) if wide else ())
        return [{"XBLOCK": side(x, a), "YBLOCK": side(r, b), "num_warps": w}
                for a, b, w in shapes]  # fmt: skip
    if not meta["reduction"]:
        configs = [{"XBLOCK": min(1024, next_pow2(x)), "num_warps": 4},
                   {"XBLOCK": min(256, next_pow2(x)), "num_warps": 2}]  # fmt: skip
        return configs + ([{"XBLOCK": min(2048, next_pow2(x)), "num_warps": 8}] if wide else [])
    if meta["persistent"]:
        rb = next_pow2(r)
        default = max(1, min(8, 4096 // rb, next_pow2(x)))
        configs = [{"XBLOCK": default, "RBLOCK": rb, "num_warps": w}
                   for w in ((4, 8, 2) if wide else (4, 8))]  # fmt: skip
        # Short rows (a thin product's K of 4, a softmax over 49 window positions): 8 rows a
        # program left each a few dozen elements, millions of programs; wider blocks are tried
        # (narrow: one, of at least 16 rows and at most 4096 elements)
        wider = (4096 // rb, 1024 // rb) if wide else (max(16, 1024 // rb),)
        for rows in wider:
            rows = min(rows, 256, next_pow2(x))
            if rows > 8 and rows * rb <= 4096 and all(c["XBLOCK"] != rows for c in configs):
                configs.append({"XBLOCK": rows, "RBLOCK": rb, "num_warps": 4})
        return configs
    if meta.get("columns"):
        # x walks memory: 8 or 16 columns of 16-bit values already fill a 32-byte sector, and
        # narrow blocks leave more programs; wider ones are tried
        shapes = ((16, 64), (32, 32)) + (((8, 128), (64, 16)) if wide else ())
        return [{"XBLOCK": min(c, next_pow2(x)), "RBLOCK": min(rb, next_pow2(r)), "num_warps": 4}
                for c, rb in shapes]  # fmt: skip
    configs = [{"XBLOCK": 1, "RBLOCK": 2048, "num_warps": 8},
               {"XBLOCK": 1, "RBLOCK": 512, "num_warps": 4}]  # fmt: skip
    return configs + ([{"XBLOCK": 8, "RBLOCK": 256, "num_warps": 4}] if wide else [])


def grid_of(src: KernelSource, cfg: dict) -> tuple:
    """The launch grid as sympy expressions (over the size symbols when sizes are dynamic)."""
    meta = dict(src.meta)
    xnumel = sympy.sympify(meta["numel"][0]) if "numel" in meta else sympy.Integer(meta["xnumel"])
    if meta.get("tiled"):
        return (CeilDiv(xnumel, sympy.Integer(cfg["XBLOCK"])),
                CeilDiv(sympy.Integer(meta["rnumel"]), sympy.Integer(cfg["YBLOCK"])))  # fmt: skip
    return (CeilDiv(xnumel, sympy.Integer(cfg["XBLOCK"])),)


# A tile's sides: the inner dims at least this many elements, each memory-walking outer dim too.
TILE_MIN = 16
# Grid dim 1 (the inner dims' tiles) holds at most 65535 programs.
TILE_MAX_INNER = 65535 * 16


def _tile_split(xvars, xsizes, accesses) -> Optional[int]:
    """Where to split a pointwise kernel's dims into [outer | inner] tiles, or None for a flat
    kernel: when some access walks memory along an outer dim (stride 1 there) while not along
    the innermost one, as a transposing copy reads, a flat block reads (or writes) one element
    per 32-byte sector; in a tile both sides move whole sectors (Triton shuffles the block
    through shared memory between the two orders)."""
    if len(xvars) < 2 or not all(sympy.sympify(s).is_Integer for s in xsizes):
        return None
    sizes = [int(s) for s in xsizes]
    split = None
    for e in accesses:
        if free_symbols_of(e) - set(xvars):
            continue  # an indirect (gathered) address: its walk is not known here
        steps = unit_steps(e, xvars, xvars)
        if steps is None or steps[-1] in (0, 1, -1):
            continue
        for j in range(len(xvars) - 2, -1, -1):
            if steps[j] == 1 and sizes[j] >= TILE_MIN:
                split = max(split or 0, j + 1)
                break
    if split is None:
        return None
    inner = math.prod(sizes[split:])
    if inner < TILE_MIN or inner > TILE_MAX_INNER or math.prod(sizes[:split]) < TILE_MIN:
        return None
    return split


__all__ = ["CantRender", "TritonRenderer", "grid_of", "launch_configs"]
