"""The loop-level IR: buffers whose bodies are define-by-run functions over a small `ops` handler.

A computed buffer holds a body: a Python function of sympy loop variables that calls `ops.load`,
math ops, `ops.reduction` and `ops.store`. What the body *means* depends on the handler installed
while it runs: `TextHandler` prints it, `Interpreter` evaluates it with torch (the reference
semantics), and the code generators' handlers emit C++ or Triton. Index expressions are sympy over
the loop variables, using ember.ir's FloorDiv and ModularIndexing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import threading
from collections.abc import Callable
from typing import Any

import sympy
import torch

from ember.ir import dtype_name
from ember.ir.symbols import free_symbols_of
from ember.primtorch.prims.random import philox_words

# --- the ops vocabulary ------------------------------------------------------------------------

UNARY_OPS = [
    "neg",
    "abs",
    "exp",
    "exp2",
    "expm1",
    "log",
    "log1p",
    "log2",
    "log10",
    "sqrt",
    "rsqrt",
    "sin",
    "cos",
    "tan",
    "tanh",
    "asin",
    "acos",
    "atan",
    "sinh",
    "cosh",
    "asinh",
    "acosh",
    "atanh",
    "erf",
    "erfc",
    "erfinv",
    "lgamma",
    "reciprocal",
    "floor",
    "ceil",
    "trunc",
    "round",
    "sign",
    "signbit",
    "isnan",
    "isinf",
    "isfinite",
    "logical_not",
    "bitwise_not",
    "sigmoid",
    "relu",
]
BINARY_OPS = [
    "add",
    "sub",
    "mul",
    "truediv",
    "floordiv",
    "truncdiv",
    "remainder",
    "fmod",
    "maximum",
    "minimum",
    "pow",
    "atan2",
    "hypot",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "logical_and",
    "logical_or",
    "logical_xor",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "shift_left",
    "shift_right",
    # philox(seed, counter): the first 32-bit word (int64) of Philox4x32-10 at `counter` with key
    # `seed`, both int64 (ember.primtorch.prims.random; Triton's tl.randint)
    "philox",
]
COMPARE_OPS = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
               "logical_not", "isnan", "isinf", "isfinite", "signbit"}  # fmt: skip
SPECIAL_OPS = [
    "load",
    "store",
    "reduction",
    "index_expr",
    "constant",
    "to_dtype",
    "masked",
    "where",
    "indirect_indexing",
]
REDUCTION_TYPES = ("sum", "prod", "max", "min", "any", "argmax", "argmin")

# Per thread: two threads lowering or rendering at once each run bodies under their own handler.
# One list for the process let a thread's body call the other thread's handler (a C++ renderer
# got a checker's values: "'str' object has no attribute 'dtype'", or a body stored into the
# other thread's buffer).
_LOCAL = threading.local()


def _handler_stack() -> list:
    stack = getattr(_LOCAL, "stack", None)
    if stack is None:
        stack = _LOCAL.stack = []
    return stack


class _OpsProxy:
    """`ops.<name>(...)` calls the method of the handler installed by `set_handler`."""

    def __getattr__(self, name):
        stack = _handler_stack()
        if not stack:
            raise RuntimeError("ops used with no handler installed (use loop_ir.set_handler)")
        return getattr(stack[-1], name)


ops = _OpsProxy()


@contextlib.contextmanager
def set_handler(handler):
    """Install `handler` as the meaning of `ops` while the block runs."""
    stack = _handler_stack()
    stack.append(handler)
    try:
        yield handler
    finally:
        stack.pop()


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a kernel computes in: half types load as float32 and round on store."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def result_dtype(name: str, args) -> torch.dtype | None:
    """The dtype of a math op's result, from the dtypes of its value arguments."""
    if name in COMPARE_OPS:
        return torch.bool
    return args[0] if args else None


# --- buffers and layouts -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a buffer's elements live: dtype, device, sizes, strides, storage offset (sympy)."""

    dtype: torch.dtype
    device: str
    sizes: tuple
    strides: tuple
    offset: sympy.Expr = sympy.S.Zero

    def index(self, idx) -> sympy.Expr:
        return self.offset + sum((i * s for i, s in zip(idx, self.strides)), sympy.S.Zero)

    def storage_size(self) -> sympy.Expr:
        if any(s == 0 for s in self.sizes):
            return sympy.S.Zero
        return 1 + self.offset + sum((s - 1) * st for s, st in zip(self.sizes, self.strides))

    def numel(self) -> sympy.Expr:
        return sympy.Mul(*self.sizes) if self.sizes else sympy.S.One

    def describe(self) -> str:
        return f"{dtype_name(self.dtype)}[{', '.join(map(str, self.sizes))}]" + (
            f" strides [{', '.join(map(str, self.strides))}]"
            + (f" offset {self.offset}" if self.offset != 0 else "")
        )


@dataclasses.dataclass(eq=False)
class Buffer:
    """A named tensor of the program: a graph input, a computed buffer or an extern's output."""

    name: str
    layout: Layout

    @property
    def dtype(self):
        return self.layout.dtype


@dataclasses.dataclass(eq=False)
class InputBuffer(Buffer):
    """A graph input (a placeholder of the prim graph)."""


@dataclasses.dataclass(eq=False)
class Pointwise:
    """`ranges` loop variables; `inner_fn(index)` returns the value at that index."""

    ranges: tuple
    inner_fn: Callable
    dtype: torch.dtype


@dataclasses.dataclass(eq=False)
class Reduction:
    """`ranges` kept and `reduction_ranges` reduced; `inner_fn(index, rindex)` is the value."""

    ranges: tuple
    reduction_ranges: tuple
    reduction_type: str
    inner_fn: Callable
    dtype: torch.dtype
    src_dtype: torch.dtype


@dataclasses.dataclass(eq=False)
class ComputedBuffer(Buffer):
    """A buffer computed by a loop nest: the body stores one element per index."""

    data: Any = None  # Pointwise or Reduction

    @property
    def ranges(self) -> tuple:
        return tuple(self.data.ranges)

    @property
    def reduction_ranges(self) -> tuple:
        return tuple(getattr(self.data, "reduction_ranges", ()))

    def is_reduction(self) -> bool:
        return isinstance(self.data, Reduction)

    def store_index(self, index) -> sympy.Expr:
        return self.layout.index(index)

    def body(self, index, rindex=()):
        """Run the body once under the installed handler: compute and store one element."""
        d = self.data
        if isinstance(d, Pointwise):
            value = d.inner_fn(list(index))
        else:
            value = ops.reduction(d.dtype, d.src_dtype, d.reduction_type,
                                  d.inner_fn(list(index), list(rindex)))  # fmt: skip
        return ops.store(self.name, self.store_index(index), value)


@dataclasses.dataclass(eq=False)
class IndexedWrite(ComputedBuffer):
    """Rows of a graph input written where the input is (a KV cache's new rows): `data` (a
    Pointwise over the update's ranges) stored into the memory of `target` (the input's
    buffer; this buffer's layout is the written view of it, its offset from the target's
    start), at row `index[i[dim]]` of dimension `dim` (negative rows from the end, as indexing
    does; a row outside the target's writes nothing: a kernel cannot raise). Made only where
    nothing else reads the old value (input_updates.py). Its readers read other rows than its
    own, so no kernel fuses after it; its producers do fuse into it."""

    target: Buffer = None  # an InputBuffer
    # the rows: 1-D integers, element j of buffer `index` at index_offset + index_stride * j
    index: Buffer = None
    index_stride: Any = sympy.S.One
    index_offset: Any = sympy.S.Zero
    dim: int = 0

    def body(self, index, rindex=()):
        value = self.data.inner_fn(list(index))
        rows = self.layout.sizes[self.dim]
        at = ops.load(self.index.name, self.index_offset + self.index_stride * index[self.dim])
        at = ops.to_dtype(at, torch.int64)
        # a row in range once wrapped (indirect_indexing wraps a negative one) is in [-rows, rows)
        inside = ops.logical_and(ops.ge(at, ops.index_expr(-rows, torch.int64)),
                                 ops.lt(at, ops.index_expr(rows, torch.int64)))  # fmt: skip
        row = ops.indirect_indexing(at, rows)
        where = [row if d == self.dim else i for d, i in enumerate(index)]
        return ops.store(self.name, self.layout.index(where), value, inside)


@dataclasses.dataclass(eq=False)
class ExternBuffer(Buffer):
    """The output of an extern kernel call (a torch eager op, or a prim's reference)."""

    op: str = ""  # vocabulary name, e.g. "extern.mm"
    fn: Callable = None
    args: tuple = ()  # with `Buffer`s where tensors go
    kwargs: dict = dataclasses.field(default_factory=dict)
    outputs: tuple = ()  # for several outputs: names of the MultiOutput buffers


@dataclasses.dataclass(eq=False)
class TemplateBuffer(ExternBuffer):
    """The output of a hand-written C++ kernel (a template such as cpu_attention's flash
    attention): scheduled as a step of its own, like an extern call, but run as kernel `kernel`,
    whose source `render(kernel)` gives (a KernelSource taking the buffers of `args`, then this
    one). `fn(*args)` is its reference, for the interpreter. `checks`: relations between
    dynamic sizes that must hold when it runs (checked by the wrapper, guards of the artifact)."""

    kernel: str = ""
    render: Callable = None
    checks: tuple = ()


def extern_buffers(args):
    """The Buffers in an extern call's arguments, at any depth (extern.custom_op nests them)."""
    if isinstance(args, Buffer):
        yield args
    elif isinstance(args, (list, tuple)):
        for a in args:
            yield from extern_buffers(a)
    elif isinstance(args, dict):
        for a in args.values():
            yield from extern_buffers(a)


@dataclasses.dataclass(eq=False)
class MultiOutput(Buffer):
    """Output `index` of a multi-output extern call."""

    source: ExternBuffer = None
    index: int = 0


@dataclasses.dataclass(eq=False)
class AliasBuffer(Buffer):
    """A strided view of another buffer, handed to an extern or returned (no kernel, no copy)."""

    source: Buffer = None


def loop_vars(prefix: str, n: int) -> list:
    return list(_loop_vars(prefix, n))


@functools.lru_cache(maxsize=256)  # asked tens of thousands of times a compile; Symbol() is slow
def _loop_vars(prefix: str, n: int) -> tuple:
    return tuple(sympy.Symbol(f"{prefix}{i}", integer=True, nonnegative=True) for i in range(n))


# --- text form ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1 << 16)
def printed(index) -> str:
    """str(index), remembered: the lowering prints each reduction's body to find repeats (a mean
    and a variance of one value), and every layer's reductions print the same indices; sympy's
    printer sorts an Add's terms each time (GPT-2's training step: 0.3 s of printing)."""
    return str(index)


class TextHandler:
    """Records a body as numbered lines: `tmp3 = exp(tmp2)`."""

    def __init__(self):
        self.lines: list[str] = []
        self._ids = itertools.count()

    def _emit(self, text: str) -> str:
        name = f"tmp{next(self._ids)}"
        self.lines.append(f"{name} = {text}")
        return name

    def __getattr__(self, name):
        if name in UNARY_OPS or name in BINARY_OPS:
            return lambda *args: self._emit(f"{name}({', '.join(map(str, args))})")
        raise AttributeError(name)

    def _index(self, index) -> str:
        return printed(index)

    def load(self, name, index):
        return self._emit(f"load({name}, {self._index(index)})")

    def store(self, name, index, value, mask=None):
        where = f", mask={mask}" if mask is not None else ""
        self.lines.append(f"store({name}, {self._index(index)}, {value}{where})")

    def reduction(self, dtype, src_dtype, rtype, value):
        return self._emit(f"reduction({rtype}, {dtype_name(dtype)}, {value})")

    def index_expr(self, expr, dtype):
        return self._emit(f"index_expr({self._index(expr)}, {dtype_name(dtype)})")

    def constant(self, value, dtype):
        return self._emit(f"constant({value!r}, {dtype_name(dtype)})")

    def to_dtype(self, value, dtype):
        return self._emit(f"to_dtype({value}, {dtype_name(dtype)})")

    def where(self, cond, a, b):
        return self._emit(f"where({cond}, {a}, {b})")

    def masked(self, mask, body, other):
        self.lines.append(f"masked({mask}):")
        start = len(self.lines)
        result = body()
        self.lines[start:] = ["  " + line for line in self.lines[start:]]
        return self._emit(f"masked_result({mask}, {result}, {other!r})")

    def indirect_indexing(self, value, size):
        return sympy.Symbol(f"ind_{value}", integer=True)


class SketchHandler(TextHandler):
    """TextHandler's lines with every index printed as `?`: enough to count ops and loads, and
    printing sympy indices would cost most of a compile."""

    def _index(self, index) -> str:
        return "?"


def body_text(buf: ComputedBuffer) -> str:
    """The readable form of one computed buffer."""
    kind = "pointwise" if not buf.is_reduction() else f"reduction {buf.data.reduction_type}"
    xs, rs = loop_vars("i", len(buf.ranges)), loop_vars("r", len(buf.reduction_ranges))
    with set_handler(TextHandler()) as h:
        buf.body(xs, rs)
    ranges = ", ".join(map(str, buf.ranges))
    rr = ", ".join(map(str, buf.reduction_ranges))
    head = f"{buf.name}: {buf.layout.describe()} = {kind} [{ranges}]" + (f" x [{rr}]" if rr else "")
    return "\n".join([head] + ["  " + line for line in h.lines])


def program_text(buffers) -> str:
    """The readable form of a lowered program (a list of buffers)."""
    out = []
    for b in buffers:
        if isinstance(b, ComputedBuffer):
            out.append(body_text(b))
        elif isinstance(b, ExternBuffer):
            args = ", ".join(a.name if isinstance(a, Buffer) else repr(a) for a in b.args)
            out.append(f"{b.name}: {b.layout.describe()} = extern {b.op}({args})")
        elif isinstance(b, MultiOutput):
            out.append(f"{b.name}: {b.layout.describe()} = {b.source.name}[{b.index}]")
        elif isinstance(b, AliasBuffer):
            out.append(f"{b.name}: {b.layout.describe()} = view of {b.source.name}")
    return "\n".join(out)


# --- interpreter: the reference semantics ------------------------------------------------------

_TORCH_UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "exp2": torch.exp2,
    "expm1": torch.expm1, "log": torch.log, "log1p": torch.log1p, "log2": torch.log2,
    "log10": torch.log10, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sin": torch.sin,
    "cos": torch.cos, "tan": torch.tan, "tanh": torch.tanh, "asin": torch.asin,
    "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh,
    "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh, "erf": torch.erf,
    "erfc": torch.erfc, "erfinv": torch.erfinv, "lgamma": torch.lgamma,
    "reciprocal": torch.reciprocal, "floor": torch.floor, "ceil": torch.ceil,
    "trunc": torch.trunc, "round": torch.round, "sign": torch.sign, "signbit": torch.signbit,
    "isnan": torch.isnan, "isinf": torch.isinf, "isfinite": torch.isfinite,
    "logical_not": torch.logical_not, "bitwise_not": torch.bitwise_not,
    "sigmoid": torch.sigmoid, "relu": torch.relu,
}  # fmt: skip
_TORCH_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "truediv": torch.true_divide,
    "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "truncdiv": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "remainder": torch.remainder, "fmod": torch.fmod, "maximum": torch.maximum,
    "minimum": torch.minimum, "pow": torch.pow, "atan2": torch.atan2, "hypot": torch.hypot,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor, "bitwise_and": torch.bitwise_and,
    "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor,
    "shift_left": torch.bitwise_left_shift, "shift_right": torch.bitwise_right_shift,
    "philox": lambda seed, counter: philox_words(torch.as_tensor(seed), torch.as_tensor(counter)),
}  # fmt: skip
_SYMPY_TO_TORCH = {
    "FloorDiv": lambda a, b: a // b,
    "ModularIndexing": lambda x, d, m: (x // d) % m,
    "Max": lambda *a: max(a) if all(isinstance(x, int) for x in a) else _tmax(a),
    "Min": lambda *a: min(a) if all(isinstance(x, int) for x in a) else _tmin(a),
}


def _tmax(a):
    out = torch.as_tensor(a[0])
    for x in a[1:]:
        out = torch.maximum(out, torch.as_tensor(x))
    return out


def _tmin(a):
    out = torch.as_tensor(a[0])
    for x in a[1:]:
        out = torch.minimum(out, torch.as_tensor(x))
    return out


def eval_index(expr, env: dict):
    """Evaluate an integer index expression with tensors (or ints) bound to its symbols."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return int(expr)
    syms = sorted(expr.free_symbols, key=lambda s: s.name)
    fn = sympy.lambdify(syms, expr, modules=[_SYMPY_TO_TORCH, "math"])
    return fn(*(env[s.name] for s in syms))


class Interpreter:
    """Evaluates bodies over whole iteration spaces at once, with torch tensors as values."""

    def __init__(self, storages: dict, layouts: dict, sizevars: dict):
        self.storages = storages  # buffer name -> 1-D tensor over the buffer's storage
        self.layouts = layouts
        self.env = dict(sizevars)
        self.mask = None

    def __getattr__(self, name):
        if name in _TORCH_UNARY:
            return _TORCH_UNARY[name]
        if name in _TORCH_BINARY:
            return _TORCH_BINARY[name]
        raise AttributeError(name)

    def load(self, name, index):
        idx = torch.as_tensor(eval_index(index, self.env))
        storage = self.storages[name]
        if self.mask is not None:  # masked-off lanes may index out of bounds
            idx = torch.where(self.mask, idx, torch.zeros_like(idx))
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= storage.numel()):
            # A lane that is not masked off reads outside its buffer: on a GPU, an illegal
            # memory access (or silently wrong values).
            raise IndexError(f"load from {name} at {index}: indices {int(idx.min())}.."
                             f"{int(idx.max())} outside its {storage.numel()} elements")  # fmt: skip
        return storage[idx]

    def store(self, name, index, value, mask=None):
        idx = torch.as_tensor(eval_index(index, self.env))
        value = torch.as_tensor(value)
        keep = torch.as_tensor(True if mask is None else mask)
        shape = torch.broadcast_shapes(idx.shape, value.shape, keep.shape)
        dst = self.storages[name]
        idx, value = idx.expand(shape).reshape(-1), value.expand(shape).reshape(-1)
        if mask is not None:  # lanes masked off write nothing (their index may be anywhere)
            keep = keep.expand(shape).reshape(-1)
            idx, value = idx[keep], value[keep]
        dst[idx] = value.to(dst.dtype)

    def reduction(self, dtype, src_dtype, rtype, value):
        value = torch.as_tensor(value).expand(self.full_shape)
        dims = tuple(range(self.nx, len(self.full_shape)))
        flat = value.flatten(self.nx) if dims else value.unsqueeze(-1)
        red = {
            "sum": lambda v: v.sum(-1, dtype=dtype), "prod": lambda v: v.prod(-1, dtype=dtype),
            "max": lambda v: v.amax(-1), "min": lambda v: v.amin(-1), "any": lambda v: v.any(-1),
            "argmax": lambda v: v.argmax(-1), "argmin": lambda v: v.argmin(-1),
        }[rtype](flat)  # fmt: skip
        return red.to(dtype).reshape(red.shape + (1,) * len(dims))

    def index_expr(self, expr, dtype):
        return torch.as_tensor(eval_index(expr, self.env)).to(dtype)

    def constant(self, value, dtype):
        return torch.tensor(value, dtype=dtype)

    def to_dtype(self, value, dtype):
        return torch.as_tensor(value).to(dtype)

    def where(self, cond, a, b):
        return torch.where(torch.as_tensor(cond), torch.as_tensor(a), torch.as_tensor(b))

    def masked(self, mask, body, other):
        mask = torch.as_tensor(mask)
        outer, self.mask = self.mask, mask if self.mask is None else (self.mask & mask)
        try:
            value = torch.as_tensor(body())
        finally:
            self.mask = outer
        return torch.where(mask, value, torch.tensor(other, dtype=value.dtype))

    def indirect_indexing(self, value, size):
        name = f"_ind{len(self.env)}"
        v = torch.as_tensor(value).long()
        self.env[name] = torch.where(v < 0, v + int(size), v)
        return sympy.Symbol(name, integer=True)

    def run(self, buf: ComputedBuffer):
        xs, rs = buf.ranges, buf.reduction_ranges
        self.nx = len(xs)
        self.full_shape = tuple(int(s.subs(self._subs())) for s in (*xs, *rs))
        xv, rv = loop_vars("i", len(xs)), loop_vars("r", len(rs))
        n = len(self.full_shape)
        for k, (v, size) in enumerate(zip([*xv, *rv], self.full_shape)):
            shape = [1] * n
            shape[k] = size
            self.env[v.name] = torch.arange(size).reshape(shape)
        with set_handler(self):
            buf.body(xv, rv)

    def _subs(self):
        return {sympy.Symbol(k, integer=True, positive=True): v
                for k, v in self.env.items() if isinstance(v, int)}  # fmt: skip


def interpret(buffers, inputs: dict, sizevars: dict | None = None) -> dict:
    """Run a lowered program with the reference interpreter; returns every buffer as a tensor."""
    sizevars = dict(sizevars or {})
    subs = {sympy.Symbol(k, integer=True, positive=True): v for k, v in sizevars.items()}
    storages, layouts, tensors = {}, {}, {}
    for name, t in inputs.items():
        n = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
        storages[name] = torch.empty(0, dtype=t.dtype).set_(
            t.untyped_storage(), t.storage_offset(), (n,)
        )
        tensors[name] = t
    for b in buffers:
        layouts[b.name] = b.layout
        if isinstance(b, InputBuffer):
            continue
        lay = b.layout
        sizes = [int(sympy.sympify(s).subs(subs)) for s in lay.sizes]
        strides = [int(sympy.sympify(s).subs(subs)) for s in lay.strides]
        if isinstance(b, IndexedWrite):  # the target's own memory, written in place
            storages[b.name] = base = storages[b.target.name]
            Interpreter(storages, layouts, sizevars).run(b)
            tensors[b.name] = base.as_strided(sizes, strides,
                                              base.storage_offset() + int(lay.offset))  # fmt: skip
        elif isinstance(b, ComputedBuffer):
            n = int(sympy.sympify(lay.storage_size()).subs(subs))
            storages[b.name] = torch.zeros(max(n, 1), dtype=b.dtype)
            Interpreter(storages, layouts, sizevars).run(b)
            tensors[b.name] = storages[b.name].as_strided(sizes, strides, int(lay.offset))
        else:
            out = _run_extern(b, tensors)
            tensors[b.name] = out
            if isinstance(out, torch.Tensor):
                n = out.untyped_storage().nbytes() // out.element_size() - out.storage_offset()
                storages[b.name] = torch.empty(0, dtype=out.dtype).set_(
                    out.untyped_storage(), out.storage_offset(), (n,)
                )
    return tensors


def _run_extern(b, tensors):
    if isinstance(b, AliasBuffer):
        lay = b.layout
        return tensors[b.source.name].as_strided(
            [int(s) for s in lay.sizes], [int(s) for s in lay.strides], int(lay.offset)
        )
    if isinstance(b, MultiOutput):
        return tensors[b.source.name][b.index]
    args = [tensors[a.name] if isinstance(a, Buffer) else a for a in b.args]
    args = [[tensors[x.name] if isinstance(x, Buffer) else x for x in a]
            if isinstance(a, (list, tuple)) else a for a in args]  # fmt: skip
    return b.fn(*args, **b.kwargs)


# --- invariants ----------------------------------------------------------------------------------


class _Checker(SketchHandler):  # checks indices, never prints them
    def __init__(self, known: set, allowed_symbols: set, where: str):
        super().__init__()
        self.known, self.allowed, self.context = known, allowed_symbols, where

    def _check_index(self, name, index):
        if name is not None and name not in self.known:
            raise AssertionError(f"{self.context}: reads or writes unknown buffer {name}")
        free = {s.name for s in free_symbols_of(index)}
        bad = {s for s in free if s not in self.allowed and not s.startswith("ind_")}
        if bad:
            raise AssertionError(
                f"{self.context}: index {index} uses unbound symbols {sorted(bad)}"
            )

    def load(self, name, index):
        self._check_index(name, index)
        return super().load(name, index)

    def store(self, name, index, value, mask=None):
        self._check_index(name, index)
        if not self.context.startswith(name):
            raise AssertionError(f"{self.context} stores into {name}, not its own buffer")
        super().store(name, index, value, mask)

    def index_expr(self, expr, dtype):
        self._check_index(None, expr)
        return super().index_expr(expr, dtype)

    def reduction(self, dtype, src_dtype, rtype, value):
        if rtype not in REDUCTION_TYPES:
            raise AssertionError(f"{self.context}: unknown reduction type {rtype}")
        return super().reduction(dtype, src_dtype, rtype, value)


def verify(buffers, size_symbols=()) -> None:
    """Check a lowered program: names unique, reads only earlier buffers, indices well-formed."""
    known: set = set()
    for b in buffers:
        if b.name in known:
            raise AssertionError(f"buffer {b.name} defined twice")
        if len(b.layout.sizes) != len(b.layout.strides):
            raise AssertionError(f"{b.name}: sizes and strides differ in length")
        if isinstance(b, ComputedBuffer):
            xs = loop_vars("i", len(b.ranges))
            rs = loop_vars("r", len(b.reduction_ranges))
            if len(b.ranges) != len(b.layout.sizes):
                raise AssertionError(f"{b.name}: loop ranges do not match its layout")
            allowed = {v.name for v in (*xs, *rs)} | {str(s) for s in size_symbols}
            with set_handler(_Checker(known | {b.name}, allowed, b.name)):
                b.body(xs, rs)
        elif isinstance(b, ExternBuffer):
            for x in extern_buffers(b.args):
                if x.name not in known:
                    raise AssertionError(f"{b.name}: extern reads unknown buffer {x.name}")
        known.add(b.name)
