"""The C++/OpenMP renderer: parallel outer loops, an explicit vector inner loop plus a scalar tail.

The vector loop is rendered first; a kernel it cannot express (integer math beyond index
arithmetic, a masked load other than contiguous float32) raises CantRender and keeps only the
scalar loop. Inside the vector loop, integer and bool values that do not vary with the vector
variable (a token id, an index of the outer loops) stay scalars ("uniform" values, CSEVar.vec
False), and index arithmetic that does vary (a causal mask's column minus row) runs in float
lanes, exact while every value it takes is bounded by 2**24. Vector code uses the GCC vector
types of csrc/ember_cpu.h, whose width and intrinsics follow the ISA the kernel is built for.
"""

from __future__ import annotations

import math

import sympy
import torch

from ember.ir.symbols import FloorDiv, ModularIndexing

from .codegen_common import (
    CantRender, CSEVar, KernelSource, Renderer, buffer_ptr_type, code_text, merge_dims,
    size_symbols_in,
)  # fmt: skip
from .loop_ir import COMPARE_OPS, compute_dtype

CTYPE = {
    torch.float32: "float", torch.float64: "double", torch.float16: "uint16_t",
    torch.bfloat16: "uint16_t", torch.int64: "int64_t", torch.int32: "int32_t",
    torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool",
    torch.uint16: "uint16_t", torch.uint32: "uint32_t", torch.uint64: "uint64_t",
}  # fmt: skip
# A loop is split across threads only when each of OpenMP's threads gets this many elements of
# work: below it the fork and join cost more than the split saves. Per thread, not in all: on 2
# threads a BERT layer's 16K-element kernels gain (small_bert 1.053 -> 0.945 ms), while on 16
# the same total bar (32768) as before holds.
PARALLEL_MIN_PER_THREAD = 2048
PARALLEL_MIN = 2 * PARALLEL_MIN_PER_THREAD  # a static total below it: no parallel loop at all
PARALLEL_ALWAYS = 1 << 20  # a static total from it on: split whatever the team's size


def _parallel_for(total) -> str:
    """The OpenMP pragma of a kernel's outer loop over `total` elements of work. The team is always
    OpenMP's whole one (as torch's own parallel loops use): libgomp ends the surplus threads when
    a smaller team follows a larger one and creates them again for the next large one, so a team
    sized by each kernel's work started threads at every call. A total under
    PARALLEL_MIN_PER_THREAD elements per thread of the team runs on one thread through the `if`
    clause, which leaves the team alone."""
    if total.is_Integer and total >= PARALLEL_ALWAYS:
        return "#pragma omp parallel for"
    per_thread = f"{PARALLEL_MIN_PER_THREAD} * ember::omp_threads()"
    return f"#pragma omp parallel for if(({code_text(total)}) >= {per_thread})"


CHUNK = 4096  # elements per OpenMP work item in one-dimensional loops

SCALAR_UNARY = {
    "neg": "-{0}", "abs": "std::abs({0})", "exp": "std::exp({0})", "exp2": "std::exp2({0})",
    "expm1": "std::expm1({0})", "log": "std::log({0})", "log1p": "std::log1p({0})",
    "log2": "std::log2({0})", "log10": "std::log10({0})", "sqrt": "std::sqrt({0})",
    "rsqrt": "{one} / std::sqrt({0})", "sin": "std::sin({0})", "cos": "std::cos({0})",
    "tan": "std::tan({0})", "tanh": "std::tanh({0})", "asin": "std::asin({0})",
    "acos": "std::acos({0})", "atan": "std::atan({0})", "sinh": "std::sinh({0})",
    "cosh": "std::cosh({0})", "asinh": "std::asinh({0})", "acosh": "std::acosh({0})",
    "atanh": "std::atanh({0})", "erf": "std::erf({0})", "erfc": "std::erfc({0})",
    "erfinv": "ember::erfinv({0})", "lgamma": "std::lgamma({0})", "reciprocal": "{one} / {0}",
    "floor": "std::floor({0})", "ceil": "std::ceil({0})", "trunc": "std::trunc({0})",
    "round": "std::nearbyint({0})", "sign": "ember::sign({0})", "signbit": "ember::signbit({0})",
    "isnan": "std::isnan({0})", "isinf": "std::isinf({0})", "isfinite": "std::isfinite({0})",
    "logical_not": "!{0}", "bitwise_not": "~{0}", "sigmoid": "ember::sigmoid({0})",
    "relu": "ember::max_prop({0}, decltype({0})(0))",
}  # fmt: skip
SCALAR_BINARY = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "truediv": "{0} / {1}",
    "floordiv": "ember::floordiv({0}, {1})", "truncdiv": "{0} / {1}",
    "remainder": "ember::pymod({0}, {1})", "fmod": "std::fmod({0}, {1})",
    "maximum": "ember::max_prop({0}, {1})", "minimum": "ember::min_prop({0}, {1})",
    "pow": "std::pow({0}, {1})", "atan2": "std::atan2({0}, {1})", "hypot": "std::hypot({0}, {1})",
    "eq": "{0} == {1}", "ne": "{0} != {1}", "lt": "{0} < {1}", "le": "{0} <= {1}",
    "gt": "{0} > {1}", "ge": "{0} >= {1}", "logical_and": "{0} && {1}", "logical_or": "{0} || {1}",
    "logical_xor": "bool({0}) != bool({1})", "bitwise_and": "{0} & {1}", "bitwise_or": "{0} | {1}",
    "bitwise_xor": "{0} ^ {1}", "shift_left": "{0} << {1}", "shift_right": "{0} >> {1}",
    "philox": "ember::philox({0}, {1})",
}  # fmt: skip
VECTOR_OPS = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "truediv": "{0} / {1}",
    "neg": "-{0}", "maximum": "ember::vmax({0}, {1})", "minimum": "ember::vmin({0}, {1})",
    "abs": "ember::vabs({0})", "exp": "ember::vexp({0})", "tanh": "ember::vtanh({0})",
    "sigmoid": "ember::vsigmoid({0})", "erf": "ember::verf({0})", "sqrt": "ember::vsqrt({0})",
    "rsqrt": "1.0f / ember::vsqrt({0})", "reciprocal": "1.0f / {0}", "floor": "ember::vfloor({0})",
    "relu": "ember::vmax({0}, ember::vbcast(0.0f))", "eq": "{0} == {1}", "ne": "{0} != {1}",
    "lt": "{0} < {1}", "le": "{0} <= {1}", "gt": "{0} > {1}", "ge": "{0} >= {1}",
}  # fmt: skip
# 8-bit integers in float lanes (quantized weights): bit operations whose results stay in the
# dtype's range, so no wraparound is lost; arithmetic on them stays scalar
BYTE_INTS = (torch.int8, torch.uint8)
BYTE_VECTOR_OPS = {"bitwise_and": "ember::vand({0}, {1})", "bitwise_or": "ember::vor({0}, {1})",
                   "shift_right": "ember::vshr({0}, {1})"}  # fmt: skip
# integer types narrower than C++'s int, whose arithmetic C++ promotes to int: the result is cast
# back, so it wraps as torch's does (uint8 200 + 100 is 44)
NARROW_INTS = (torch.int8, torch.uint8, torch.int16, torch.uint16)
WRAPPING_OPS = ("add", "sub", "mul", "neg", "shift_left", "bitwise_not")
MASK_OPS = {"logical_and": "{0} & {1}", "logical_or": "{0} | {1}", "logical_not": "~{0}",
            "logical_xor": "{0} ^ {1}", "eq": "{0} == {1}", "ne": "{0} != {1}"}  # fmt: skip
REDUCE_INIT = {"sum": "0", "prod": "1", "any": "false"}
SCALAR_COMBINE = {"sum": "{0} + {1}", "prod": "{0} * {1}", "max": "ember::max_prop({0}, {1})",
                  "min": "ember::min_prop({0}, {1})", "any": "{0} || {1}"}  # fmt: skip
VECTOR_COMBINE = {"sum": "{0} + {1}", "prod": "{0} * {1}", "max": "ember::vmax({0}, {1})",
                  "min": "ember::vmin({0}, {1})"}  # fmt: skip
HORIZONTAL = {"sum": "hsum", "prod": "hprod", "max": "hmax", "min": "hmin"}
# integers in float lanes ("lane ints"): index arithmetic, exact while |value| <= 2**24
LANE_INTS = (torch.int64, torch.int32)
LANE_EXACT = 1 << 24
LANE_INT_OPS = ("add", "sub", "mul", "neg", "abs", "maximum", "minimum", *COMPARE_OPS)


def ctype(dtype) -> str:
    return CTYPE[compute_dtype(dtype)]


def c_constant(value, dtype) -> str:
    t = ctype(dtype)
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        value = float(value)
        if math.isnan(value):
            return f"std::numeric_limits<{t}>::quiet_NaN()"
        if math.isinf(value):
            return ("-" if value < 0 else "") + f"std::numeric_limits<{t}>::infinity()"
        return f"{t}({value!r})"
    return f"{t}({int(value)})"


class _PendingReduction(CSEVar):
    """The result of a reduction, known only after its loop: stores of it are deferred."""


class CppRenderer(Renderer):
    language = "cpp"
    vectorizes = True

    def assign(self, var, text):
        return f"auto {var} = {text};"

    # --- loads and stores ---------------------------------------------------------------------
    def _ptr(self, name):
        return self.args[name]

    def load(self, name, index):
        index = self.final_index(index)
        key = ("load", name, self.index_key(index))
        if key in self.cse:
            return self.cse[key]
        if key in self.locals:
            v = self.locals[key]
            if not self.vector_mode:
                return v
            if not v.dtype.is_floating_point:  # an x-level int or bool: a uniform scalar
                return CSEVar(v.name, v.dtype, False)
            if v.dtype != torch.float32:
                raise CantRender("non-float value broadcast into the vector loop")
            return self.emit(f"ember::vbcast({v})", v.dtype, key=key)
        dtype = self.dtype_of(name)
        idx = self.index_text(index)
        ptr = self._ptr(name)
        if not self.vector_mode:
            text = f"{ptr}[{idx}]"
            text = {
                torch.float16: f"ember::h2f({text})",
                torch.bfloat16: f"ember::bf2f({text})",
            }.get(dtype, text)
            return self.emit(text, compute_dtype(dtype), key=key)
        if self._load_mask is not None:  # inside a lane-masked body: only masked loads
            if dtype != torch.float32 or self._vec_stride(index) != 1:
                raise CantRender("a lane-masked load other than contiguous float32")
            return self.emit(f"ember::vmaskload({ptr} + {idx}, {self._load_mask})", dtype,
                             key=key)
        if not dtype.is_floating_point and not index.has(self.vec_var):
            # one integer (a token id) or bool for every lane: kept a scalar
            self._bound = _DTYPE_BOUND.get(dtype)
            return self.emit(f"{ptr}[{idx}]", compute_dtype(dtype), vec=False, key=key)
        try:
            stride = self._vec_stride(index)
        except CantRender:
            return self._irregular_load(name, dtype, index, key)
        if dtype == torch.bool and stride == 1:
            return self.emit(f"ember::vload_mask({ptr} + {idx})", torch.bool, key=key)
        if dtype in BYTE_INTS:  # exact in float lanes, tagged with their own dtype
            if stride == 1:
                fn = "vload_i8" if dtype == torch.int8 else "vload_u8"
                return self.emit(f"ember::{fn}({ptr} + {idx})", dtype, key=key)
            return self._irregular_load(name, dtype, index, key)
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise CantRender(f"vector load of {dtype}")
        scalar = {torch.float16: f"ember::h2f({ptr}[{idx}])",
                  torch.bfloat16: f"ember::bf2f({ptr}[{idx}])"}.get(dtype, f"{ptr}[{idx}]")  # fmt: skip
        if stride == 0:
            text = f"ember::vbcast({scalar})"
        elif stride == 1:
            fn = {torch.float16: "vload_h", torch.bfloat16: "vload_bf"}.get(dtype, "vload")
            text = f"ember::{fn}({ptr} + {idx})"
        elif dtype == torch.float32:
            text = f"ember::vgather({ptr} + {idx}, {stride})"
        else:
            raise CantRender("strided half load")
        return self.emit(text, torch.float32, key=key)

    def _irregular_load(self, name, dtype, index, key):
        """A vector load whose index is not a multiple of the vector variable plus a constant:
        one element for every lane where the index is constant across a vector (a group's scale,
        indexed by FloorDiv(r, 32)), else each lane's element in turn (a nibble's byte)."""
        if dtype not in (*BYTE_INTS, torch.float32, torch.float16, torch.bfloat16):
            raise CantRender(f"vector load of {dtype} at {index}")
        ptr, v = self._ptr(name), self.vec_var
        conv = {torch.float16: "ember::h2f", torch.bfloat16: "ember::bf2f"}.get(dtype, "")
        pattern = _pair_pattern(index, v) if dtype == torch.uint8 else None
        if _uniform_in_vector(index, v):
            text = f"ember::vbcast(static_cast<float>({conv}({ptr}[{self.index_text(index)}])))"
        elif pattern is not None:  # a packed int4 byte, or the shift of its nibble
            kind, first = pattern
            text = f"ember::vload_u8_{kind}({ptr} + {self.index_text(first)})"
        else:
            lane = sympy.Symbol("lane", integer=True, nonnegative=True)
            idx = self.index_text(index.subs(v, v + lane))
            text = (f"ember::vlanes([&](int64_t lane) {{ return static_cast<float>("
                    f"{conv}({ptr}[{idx}])); }})")  # fmt: skip
        return self.emit(text, dtype if dtype in BYTE_INTS else torch.float32, key=key)

    def _vec_stride(self, index):
        e = sympy.expand(index)
        v = self.vec_var
        c = e.coeff(v)
        if c.has(v) or sympy.expand(e - c * v).has(v) or not c.is_Integer:
            raise CantRender(f"index {index} is not affine in the vector variable")
        return int(c)

    def store(self, name, index, value):
        index = self.final_index(index)
        key = ("load", name, self.index_key(index))
        if isinstance(value, _PendingReduction):
            self.deferred[name] = (index, value)
            return
        self.cse[key] = value
        if self.at_x_level:
            self.locals[key] = value
        if name in self.kernel.local:
            return
        dtype, ptr, idx = self.dtype_of(name), self._ptr(name), self.index_text(index)
        if not self.vector_mode:
            conv = {torch.float16: "ember::f2h", torch.bfloat16: "ember::f2bf"}.get(
                dtype, f"static_cast<{CTYPE[dtype]}>"
            )
            self.lines.append(f"{ptr}[{idx}] = {conv}({value});")
            return
        stride = self._vec_stride(index) if value.vec else 0
        if stride == 0:
            raise CantRender("a vector store to one element, or of a uniform value")
        if stride != 1:  # a transposed copy: the lanes stored one by one, the rest in vectors
            if dtype != torch.float32:
                raise CantRender(f"strided vector store of {dtype}")
            self.lines.append(f"ember::vscatter({ptr} + {idx}, {stride}, {value});")
            return
        fn = {torch.float32: "vstore", torch.float16: "vstore_h", torch.bfloat16: "vstore_bf",
              torch.bool: "vstore_mask"}.get(dtype)  # fmt: skip
        if fn is None:
            raise CantRender(f"vector store of {dtype}")
        self.lines.append(f"ember::{fn}({ptr} + {idx}, {value});")

    # --- values ---------------------------------------------------------------------------------
    def constant(self, value, dtype):
        if self.vector_mode and dtype in BYTE_INTS:
            return self.emit(f"ember::vbcast({float(int(value))!r}f)", dtype)
        if self.vector_mode and not dtype.is_floating_point:  # a uniform int or bool
            self._bound = None if dtype == torch.bool else abs(int(value))
            return self.emit(c_constant(value, dtype), compute_dtype(dtype), vec=False)
        if self.vector_mode:
            if compute_dtype(dtype) != torch.float32:
                raise CantRender("non-float constant in the vector loop")
            return self.emit(f"ember::vbcast({c_constant(value, torch.float32)})", torch.float32)
        return self.emit(c_constant(value, dtype), compute_dtype(dtype))

    def index_expr(self, expr, dtype):
        if self.vector_mode:
            return self._vector_index_expr(self.final_index(expr), dtype)
        return self.emit(
            f"static_cast<{ctype(dtype)}>({self.index_text(self.final_index(expr))})",
            compute_dtype(dtype),
        )

    def _vector_index_expr(self, index, dtype):
        """An index in the vector loop: a uniform scalar where the vector variable is absent,
        else its lanes (base + stride * lane) in float lanes, refused past LANE_EXACT."""
        bound = _affine_bound(index, self.ranges)
        if not index.has(self.vec_var):
            self._bound = bound
            text = f"static_cast<{ctype(dtype)}>({self.index_text(index)})"
            return self.emit(text, compute_dtype(dtype), vec=False)
        if compute_dtype(dtype) not in (*LANE_INTS, torch.float32):
            raise CantRender(f"vector index_expr of {dtype}")
        if bound is None or bound > LANE_EXACT:
            raise CantRender(f"index {index} is not bounded within float lanes")
        stride = self._vec_stride(index)
        lanes = "ember::viota()" if stride == 1 else f"ember::viota() * {float(stride)!r}f"
        self._bound = bound if compute_dtype(dtype) in LANE_INTS else None
        base = f"ember::vbcast(static_cast<float>({self.index_text(index)}))"
        return self.emit(f"{base} + {lanes}", compute_dtype(dtype))

    def emit(self, text, dtype, vec=None, key=None):
        """Base emit, recording the bound an integer op's text was made with (self._bound)."""
        bound, self._bound = self._bound, None
        var = super().emit(text, dtype, vec=vec, key=key)
        if bound is not None and not dtype.is_floating_point and dtype != torch.bool:
            self.int_bounds.setdefault(var.name, bound)
        return var

    _bound = None  # the bound of the integer value the next emit names
    int_bounds: dict = {}  # tmp name -> largest |value|, per loop body (_body makes a fresh one)

    def _uniform_to_vector(self, value):
        """A uniform scalar's value in every lane: a mask for bools, float lanes otherwise
        (integers only while known to be exact there)."""
        if value.vec:
            return value
        if value.dtype == torch.bool:
            return self.emit(f"ember::vmbcast({value})", torch.bool, vec=True)
        bound = self.int_bounds.get(value.name)
        if value.dtype.is_floating_point or bound is None or bound > LANE_EXACT:
            raise CantRender(f"uniform {value.dtype} value broadcast into float lanes")
        self._bound = bound
        return self.emit(f"ember::vbcast(static_cast<float>({value}))", value.dtype, vec=True)

    def op_is_vector(self, args):
        if not self.vector_mode:
            return None
        return any(a.vec for a in args)

    def to_dtype(self, value, dtype):
        src = value.dtype
        if self.vector_mode and not value.vec:  # a uniform scalar
            if dtype.is_floating_point:
                if dtype != torch.float32:
                    raise CantRender(f"uniform value cast to {dtype}")
                return self.emit(f"ember::vbcast(static_cast<float>({value}))", torch.float32)
            self._bound = self.int_bounds.get(value.name) if dtype in LANE_INTS else None
            return self.emit(f"static_cast<{ctype(dtype)}>({value})", compute_dtype(dtype),
                             vec=False)
        if self.vector_mode and src in LANE_INTS:
            if dtype in LANE_INTS or dtype == torch.float32:  # the lanes hold it exactly
                self._bound = self.int_bounds.get(value.name)
                return self.emit(str(value), compute_dtype(dtype))
            if dtype == torch.bool:
                return self.emit(f"ember::vf2m({value})", torch.bool)
            raise CantRender(f"vector cast {src} -> {dtype}")
        if self.vector_mode:
            if dtype == torch.float32 and src == torch.float32:
                return value
            if src in BYTE_INTS and dtype == src:
                return value
            if src in BYTE_INTS and dtype in (torch.float32, torch.float16, torch.bfloat16):
                # the lanes hold the values already, exact in each of these types
                return self.emit(str(value), compute_dtype(dtype))
            table = {(torch.float32, torch.float16): "ember::vround_half({0})",
                     (torch.float32, torch.bfloat16): "ember::vround_bf16({0})",
                     (torch.bool, torch.float32): "ember::vm2f({0})",
                     (torch.float32, torch.bool): "ember::vf2m({0})",
                     (torch.bool, torch.bool): "{0}"}  # fmt: skip
            if (src, dtype) not in table:
                raise CantRender(f"vector cast {src} -> {dtype}")
            return self.emit(table[(src, dtype)].format(value), compute_dtype(dtype))
        if dtype == torch.float16:
            return self.emit(f"ember::round_half(static_cast<float>({value}))", torch.float32)
        if dtype == torch.bfloat16:
            return self.emit(f"ember::round_bf16(static_cast<float>({value}))", torch.float32)
        return self.emit(f"static_cast<{ctype(dtype)}>({value})", compute_dtype(dtype))

    def where(self, cond, a, b):
        if self.vector_mode:
            if not (cond.dtype == torch.bool and a.dtype == b.dtype):
                raise CantRender("vector where")
            ba, bb = self.int_bounds.get(a.name), self.int_bounds.get(b.name)
            bound = max(ba, bb) if ba is not None and bb is not None else None
            if not (cond.vec or a.vec or b.vec):
                self._bound = bound
                return self.emit(f"{cond} ? {a} : {b}", a.dtype, vec=False)
            a, b = self._uniform_to_vector(a), self._uniform_to_vector(b)
            if not cond.vec:  # one scalar condition picks a whole vector
                self._bound = bound
                return self.emit(f"{cond} ? {a} : {b}", a.dtype, vec=True)
            fn = "ember::vwhere({0}, {1}, {2})" if a.dtype != torch.bool else "{0} ? {1} : {2}"
            self._bound = bound
            return self.emit(fn.format(cond, a, b), a.dtype)
        return self.emit(f"{cond} ? {a} : {b}", a.dtype)

    def op_text(self, name, args):
        if self.vector_mode and not any(a.vec for a in args):
            return self._scalar_op_text(name, args)
        if self.vector_mode:
            args = [self._uniform_to_vector(a) for a in args]
            dts = {a.dtype for a in args}
            if dts <= set(LANE_INTS):
                return self._lane_int_op_text(name, args)
            if dts == {torch.bool} and name in MASK_OPS:
                return MASK_OPS[name].format(*args)
            if len(dts) == 1 and dts <= set(BYTE_INTS) and name in BYTE_VECTOR_OPS:
                return BYTE_VECTOR_OPS[name].format(*args)
            if dts != {torch.float32}:
                raise CantRender(f"vector {name} on {dts}")
            if name in VECTOR_OPS:
                return VECTOR_OPS[name].format(*args)
            if name in COMPARE_OPS or name.startswith(("bitwise", "logical", "shift")):
                raise CantRender(f"vector {name}")
            scalar = (SCALAR_UNARY.get(name) or SCALAR_BINARY[name]).format("a", "b", one="1.0f")
            lam = (
                "[](float a) { return %s; }"
                if len(args) == 1
                else "[](float a, float b) { return %s; }"
            )
            fn = "ember::vmap" if len(args) == 1 else "ember::vmap2"
            return f"{fn}({', '.join(map(str, args))}, {lam % scalar})"
        return self._scalar_op_text(name, args)

    def _lane_int_op_text(self, name, args):
        """Index arithmetic in float lanes: the ops exact on integers while |value| <= 2**24."""
        bounds = [self.int_bounds.get(a.name) for a in args]
        if name not in LANE_INT_OPS or None in bounds:
            raise CantRender(f"vector {name} on integer lanes")
        bound = {"add": sum, "sub": sum, "mul": math.prod}.get(name, max)(bounds)
        if bound > LANE_EXACT:
            raise CantRender(f"vector {name} may leave the exact integers of float lanes")
        self._bound = None if name in COMPARE_OPS else bound
        return VECTOR_OPS[name].format(*args)

    def _scalar_op_text(self, name, args):
        """An op on scalars: the scalar loop's, or uniform values in the vector loop."""
        if self.vector_mode:
            bounds = [self.int_bounds.get(a.name) for a in args]
            if None not in bounds and name in LANE_INT_OPS and name not in COMPARE_OPS:
                self._bound = {"add": sum, "sub": sum, "mul": math.prod}.get(name, max)(bounds)
        dtype = args[0].dtype
        one = c_constant(1, dtype) if dtype != torch.bool else "1"
        if name == "fmod" and not dtype.is_floating_point:
            return f"{args[0]} % {args[1]}"
        if name == "bitwise_not" and dtype == torch.bool:
            return f"!{args[0]}"
        if name.startswith("bitwise") and dtype == torch.bool:  # C++'s bool & bool is an int
            return f"static_cast<bool>({SCALAR_BINARY[name].format(*args)})"
        table = SCALAR_UNARY if len(args) == 1 else SCALAR_BINARY
        text = table[name].format(*args, one=one)
        if dtype in NARROW_INTS and name in WRAPPING_OPS:  # C++ computes these in int: wrap back
            return f"static_cast<{CTYPE[dtype]}>({text})"
        return text

    def masked(self, mask, body, other):
        if self.vector_mode and mask.vec:
            return self._lane_masked(mask, body, other)
        # in the vector loop, a uniform mask (a concatenation's which-input test on an outer
        # index) picks the whole vector: the body's loads run only where it holds
        first_local = next(self._ids)
        saved_lines, saved_cse = self.lines, dict(self.cse)
        self.lines = []
        result = body()
        inner, self.lines, self.cse = self.lines, saved_lines, saved_cse
        t, fill = ctype(result.dtype), c_constant(other, result.dtype)
        if self.vector_mode and result.vec:
            t, fill = ("ember::vm", f"ember::vmbcast({fill})") if result.dtype == torch.bool else (
                "ember::vf", f"ember::vbcast(static_cast<float>({fill}))")  # fmt: skip
        lam = " ".join(inner + [f"return {result};"])
        text = f"{mask} ? [&]() -> {t} {{ {lam} }}() : {fill}"
        return self.emit(text, result.dtype, vec=result.vec if self.vector_mode else None,
                         key=self.masked_key(first_local, text))

    _load_mask = None  # the vector mask a masked body's loads are taken under

    def _lane_masked(self, mask, body, other):
        """A masked body whose mask varies across the lanes (RoPE's rotate_half concatenates
        the halves of a row): its loads read only the lanes where the mask holds (vmaskload,
        contiguous float32 loads only), the rest of the body runs on every lane, and the mask
        picks between its result and `other`. Values computed under the mask stay inside it."""
        if self._load_mask is not None or mask.dtype != torch.bool:
            raise CantRender("nested or non-bool lane mask")
        saved_cse, self._load_mask = dict(self.cse), mask
        try:
            result = body()
        finally:
            self.cse, self._load_mask = saved_cse, None
        if not result.vec or result.dtype != torch.float32:
            raise CantRender(f"lane-masked {result.dtype} value")
        fill = f"ember::vbcast({c_constant(other, torch.float32)})"
        return self.emit(f"ember::vwhere({mask}, {result}, {fill})", torch.float32)

    def indirect_indexing(self, value, size):
        if self.vector_mode and value.vec:
            raise CantRender("indirect indexing in the vector loop")
        var = self.emit(f"static_cast<int64_t>({value})", torch.int64, vec=False)
        self.lines.append(f"{var} = {var} < 0 ? {var} + {size} : {var};")
        return sympy.Symbol(str(var), integer=True)

    def reduction(self, dtype, src_dtype, rtype, value):
        j = len(self.reds)
        acc = f"acc{self.phase}_{j}"
        self.reds.append((rtype, dtype, value.dtype))
        if rtype in ("argmax", "argmin"):
            if self.vector_mode:
                raise CantRender("vector argmax")
            cmp = ">" if rtype == "argmax" else "<"
            self.lines.append(f"if ({value} {cmp} {acc}_v || ({value} != {value} && {acc}_v == {acc}_v)) "
                              f"{{ {acc}_v = {value}; {acc} = {self.rflat}; }}")  # fmt: skip
        elif self.vector_mode:
            if rtype not in VECTOR_COMBINE or value.dtype != torch.float32 or not value.vec:
                raise CantRender(f"vector {rtype} reduction")
            self.lines.append(f"v{acc} = {VECTOR_COMBINE[rtype].format('v' + acc, value)};")
        else:
            self.lines.append(f"{acc} = {SCALAR_COMBINE[rtype].format(acc, value)};")
        return _PendingReduction(f"red{self.phase}_{j}", compute_dtype(dtype))

    # --- structure ------------------------------------------------------------------------------
    def render(self) -> KernelSource:
        k = self.kernel
        xs, rs, exprs = self.kernel_indices()
        self.xsizes, self.xvars, self.xassign = merge_dims(k.xsizes, xs, exprs)
        self.rsizes, self.rvars, self.rassign = merge_dims(k.rsizes, rs, exprs)
        self.ranges = dict(zip(self.xvars + self.rvars, self.xsizes + self.rsizes))
        self.locals, self.deferred = {}, {}
        body = self._pointwise_body() if not k.rsizes else self._reduction_body()
        params = [f"    auto* {p} = static_cast<{'const ' if p.startswith('in') else ''}"
                  f"{CTYPE[self.dtype_of(n)]}*>(args[{i}]);" for i, (n, p) in enumerate(self.args.items())]  # fmt: skip
        # Dynamic sizes come after the buffers, each as a pointer to an int64 (the artifact's
        # packed convention, which the C++ wrapper follows too).
        syms = size_symbols_in(body)
        params += [f"    const int64_t {name} = *static_cast<const int64_t*>(args[{len(self.args) + j}]);"
                   for j, name in enumerate(syms)]  # fmt: skip
        src = "\n".join(['#include "ember_cpu.h"', "", f"EMBER_EXPORT void {self.name}(void** args) {{",
                         *params, *body, "}", ""])  # fmt: skip
        types = tuple(buffer_ptr_type(self.dtype_of(n)) for n in self.args) + ("i64",) * len(syms)
        return KernelSource(self.name, "cpp", src, (*self.args, *syms), types)

    def _body(self, members, xassign, rassign, vector, vec_var=None, x_level=False):
        """Lines of one loop body (vector or scalar), with a fresh CSE scope."""
        self.lines, self.cse, self.vector_mode, self.vec_var = [], {}, vector, vec_var
        self.int_bounds = {}
        self.at_x_level, self.reds = x_level, []
        self.run_members(members, xassign, rassign)
        lines, self.vector_mode = self.lines, False
        return lines

    def _try_vector(self, members, xassign, rassign, vec_var):
        try:
            return self._body(members, xassign, rassign, True, vec_var), self.reds
        except CantRender:
            return None, None
        finally:
            self.vector_mode = False

    def _loop(self, var, lo, hi, body, step="1"):
        lo, hi = code_text(lo), code_text(hi)
        inc = f"++{var}" if step == "1" else f"{var} += {step}"
        return [f"for (int64_t {var} = {lo}; {var} < {hi}; {inc}) {{", *_indent(body), "}"]

    def _vector_loop(self, var, lo, hi, vec, scalar):
        """The innermost loop: vector steps, then a scalar tail."""
        lo, hi = code_text(lo), code_text(hi)
        if vec is None:
            return self._loop(var, lo, hi, scalar)
        return [f"int64_t {var} = {lo};",
                f"for (; {var} + ember::W <= {hi}; {var} += ember::W) {{", *_indent(vec), "}",
                f"for (; {var} < {hi}; ++{var}) {{", *_indent(scalar), "}"]  # fmt: skip

    def _pointwise_body(self):
        members, xv, sizes = self.kernel.members, self.xvars, self.xsizes
        if not xv:
            return _indent(self._body(members, self.xassign, [], False))
        inner = xv[-1]
        vec, _ = self._try_vector(members, self.xassign, [], inner)
        scalar = self._body(members, self.xassign, [], False)
        total = sympy.Mul(*sizes)
        par = "" if total.is_Integer and total < PARALLEL_MIN else _parallel_for(total)
        if len(xv) == 1:
            n = code_text(sizes[0])
            chunks = f"({n} + {CHUNK - 1}) / {CHUNK}"
            inner_loop = self._vector_loop(inner, "lo", "hi", vec, scalar)
            body = [
                f"const int64_t lo = c * {CHUNK}, hi = std::min<int64_t>(lo + {CHUNK}, {n});",
                *inner_loop,
            ]
            return _indent(([par] if par else []) + self._loop("c", 0, chunks, body))
        loops = self._vector_loop(inner, 0, sizes[-1], vec, scalar)
        for v, s in reversed(list(zip(xv[:-1], sizes[:-1]))):
            loops = self._loop(v, 0, s, loops)
        collapse = f" collapse({len(xv) - 1})" if len(xv) > 2 else ""
        return _indent(([par + collapse] if par else []) + loops)

    def _reduction_body(self):
        k = self.kernel
        out = []
        for i, (loop_members, post) in enumerate(k.phases):
            out += self._phase(i, loop_members, post)
        for v, s in reversed(list(zip(self.xvars, self.xsizes))):
            out = self._loop(v, 0, s, out)
        total = sympy.Mul(*self.xsizes) * sympy.Mul(*self.rsizes)
        par = self.xvars and not (total.is_Integer and total < PARALLEL_MIN)
        collapse = f" collapse({len(self.xvars)})" if len(self.xvars) > 1 else ""
        return _indent(([_parallel_for(total) + collapse] if par else []) + out)

    def _phase(self, i, loop_members, post):
        self.phase = i
        rv, rs = self.rvars, self.rsizes
        strides = [sympy.Mul(*rs[j + 1 :]) for j in range(len(rs))]
        self.rflat = " + ".join(f"{v} * {code_text(s)}" for v, s in zip(rv, strides)) or "0"
        vec, vreds = (
            self._try_vector(loop_members, self.xassign, self.rassign, rv[-1])
            if rv
            else (None, None)
        )
        scalar = self._body(loop_members, self.xassign, self.rassign, False)
        reds = self.reds
        lines = []
        for j, (rtype, dtype, vdtype) in enumerate(reds):
            t = ctype(dtype)
            init = REDUCE_INIT.get(rtype) or (
                f"-std::numeric_limits<{t}>::infinity()" if rtype in ("max", "argmax") and dtype.is_floating_point
                else f"std::numeric_limits<{t}>::infinity()" if dtype.is_floating_point
                else f"std::numeric_limits<{t}>::{'lowest' if 'max' in rtype else 'max'}()")  # fmt: skip
            if rtype in ("argmax", "argmin"):
                vt = ctype(vdtype)
                vinit = f"{'-' if rtype == 'argmax' else ''}std::numeric_limits<{vt}>::infinity()"
                lines += [f"int64_t acc{i}_{j} = 0;", f"{vt} acc{i}_{j}_v = {vinit};"]
                continue
            lines.append(f"{t} acc{i}_{j} = {init};")
            if vec is not None:
                lines.append(f"ember::vf vacc{i}_{j} = ember::vbcast({init});")
        if rv:
            loops = self._vector_loop(rv[-1], 0, rs[-1], vec, scalar)
            for v, s in reversed(list(zip(rv[:-1], rs[:-1]))):
                loops = self._loop(v, 0, s, loops)
            lines += ["{", *_indent(loops), "}"]
        else:
            lines += scalar
        for j, (rtype, dtype, _) in enumerate(reds):
            acc = f"acc{i}_{j}"
            final = (
                acc
                if vec is None or rtype not in HORIZONTAL
                else SCALAR_COMBINE[rtype].format(acc, f"ember::{HORIZONTAL[rtype]}(v{acc})")
            )
            lines.append(f"auto red{i}_{j} = {final};")
        for name, (index, value) in self.deferred.items():
            key = ("load", name, self.index_key(index))
            # resolved now: an epilogue that stores this value again stores it at once
            self.locals[key] = CSEVar(value.name, value.dtype)
            if name not in self.kernel.local:
                conv = {torch.float16: "ember::f2h", torch.bfloat16: "ember::f2bf"}.get(
                    self.dtype_of(name), f"static_cast<{CTYPE[self.dtype_of(name)]}>"
                )
                lines.append(f"{self.args[name]}[{self.index_text(index)}] = {conv}({value});")
        self.deferred = {}
        if post:
            lines += self._body(
                post, self.xassign, [sympy.S.Zero] * len(self.kernel.rsizes), False, x_level=True
            )
        return lines


MAX_VEC_WIDTH = 16  # AVX512's float lanes; every width divides it
# the largest magnitude an integer load of these types takes (wider ones: unknown)
_DTYPE_BOUND = {torch.int8: 128, torch.uint8: 255, torch.int16: 1 << 15, torch.uint16: 1 << 16}


def _affine_bound(expr, ranges):
    """The largest |expr| over the loop variables' ranges, for an affine expr with constant
    sizes; None when it cannot tell (a division, a dynamic size, an indirect index)."""
    total = 0
    for term in sympy.Add.make_args(sympy.expand(expr)):
        coeff, rest = term.as_coeff_Mul()
        if not coeff.is_Integer:
            return None
        if rest == 1:
            total += abs(int(coeff))
        elif rest in ranges and sympy.sympify(ranges[rest]).is_Integer:
            total += abs(int(coeff)) * max(int(ranges[rest]) - 1, 0)
        else:
            return None
    return total


def _uniform_in_vector(expr, v) -> bool:
    """Whether `expr` takes one value across the lanes of a vector step (v a multiple of the
    width): v enters only through FloorDiv/ModularIndexing by multiples of MAX_VEC_WIDTH of a
    base that steps with v and is otherwise aligned to MAX_VEC_WIDTH."""
    if not expr.has(v):
        return True
    if isinstance(expr, (FloorDiv, ModularIndexing)):
        base, d = expr.args[0], expr.args[1]
        if not (d.is_Integer and int(d) % MAX_VEC_WIDTH == 0):
            return False
        base = sympy.expand(base)
        rest = sympy.expand(base - v)
        if rest.has(v):
            return False
        coeffs = [t.as_coeff_Mul()[0] for t in sympy.Add.make_args(rest)]
        return all(c.is_Integer and int(c) % MAX_VEC_WIDTH == 0 for c in coeffs)
    if isinstance(expr, (sympy.Add, sympy.Mul)):
        return all(_uniform_in_vector(a, v) for a in expr.args)
    return False


def _pair_pattern(index, v):
    """("dup2", first) when lanes read elements first, first, first+1, first+1, ... (v enters
    only as FloorDiv(v + even, 2)), ("period2", first) when they read first, first+1, first,
    first+1, ... (as ModularIndexing(v + even, 1, 2)); first is the index at lane 0 (v is even:
    a multiple of the vector width). None otherwise."""
    terms = sympy.Add.make_args(sympy.expand(index))
    stepping = [t for t in terms if t.has(v)]
    if len(stepping) != 1:
        return None
    t = stepping[0]
    if isinstance(t, FloorDiv) and t.args[1] == 2:
        kind = "dup2"
    elif isinstance(t, ModularIndexing) and t.args[1] == 1 and t.args[2] == 2:
        kind = "period2"
    else:
        return None
    rest = sympy.expand(t.args[0] - v)
    coeffs = [c.as_coeff_Mul()[0] for c in sympy.Add.make_args(rest)]
    if rest.has(v) or not all(c.is_Integer and int(c) % 2 == 0 for c in coeffs):
        return None
    return kind, (index if kind == "dup2" else index - t)


def _indent(lines, n=1):
    return ["    " * n + line for line in lines]
