"""User Triton kernels launched from compiled code (`kernel[grid](*args, **constexprs)`).

The launch of a `@triton.jit` function (or of a `@triton.autotune` wrapping one) becomes one
call of the operator `ember::triton_kernel(str kernel, Tensor[] tensors, int[] written)`: the
kernel, its grid and every non-tensor argument are kept in a process-wide table under a key
that hashes the kernel's source, the grid and the arguments; the node carries the key and the
tensor arguments. The operator is functional: it launches the kernel on private copies of the
tensors the kernel may write and returns them; the graph then copies those values back into the
written tensors (`copy_`), which functionalisation turns into new values as for any in-place op.
Which arguments a kernel may write is read from its source (the pointers that reach `tl.store`
or a `tl.atomic_*`, through assignments); a pointer handed to another function counts as written.

The grid is evaluated while tracing: a tuple as it is, a function of `meta` called once per
autotuning config (with the launch's arguments and that config's values), giving the table the
launcher looks the config up in when triton calls it. Arguments must be tensors or constants
(sizes are specialised). Tensors the kernel reads are passed detached (a kernel launch is not
recorded by autograd in eager either); a kernel that may write a tensor requiring grad, and
`triton.heuristics` kernels, break the graph. On the CPU, kernels run under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import sys
import textwrap
import threading

import torch

from . import variables as V
from .exc import Unsupported

_TABLE: dict[str, tuple] = {}  # key -> (kernel, grid table, config names, constants by position)
_LOCK = threading.Lock()
_STORE_FNS = {"store", "atomic_add", "atomic_max", "atomic_min", "atomic_and", "atomic_or",
              "atomic_xor", "atomic_xchg", "atomic_cas"}  # fmt: skip
_library = None


def is_triton_kernel(obj) -> bool:
    """A triton kernel object (`@triton.jit`, `@triton.autotune`, interpreted or compiled)."""
    runtime = sys.modules.get("triton.runtime.jit")
    return runtime is not None and isinstance(obj, runtime.KernelInterface)


class TritonLaunchVT(V.VT):
    """`kernel[grid]`: a launcher waiting for its arguments."""

    def __init__(self, kernel_vt, grid_vt):
        self.kernel_vt, self.grid_vt = kernel_vt, grid_vt

    def python_type(self):
        return type(lambda: None)


def _jit_function(kernel):
    """(the innermost jit function, the autotuning configs or None)."""
    configs = None
    autotuner = sys.modules["triton.runtime.autotuner"]
    if isinstance(kernel, autotuner.Heuristics):
        raise Unsupported(f"triton.heuristics kernel {kernel.fn.__name__} (its values are "
                          "computed at launch)")  # fmt: skip
    if isinstance(kernel, autotuner.Autotuner):
        configs = kernel.configs
        kernel = kernel.fn
        if isinstance(kernel, (autotuner.Autotuner, autotuner.Heuristics)):
            raise Unsupported("a triton kernel with nested autotune/heuristics decorators")
    return kernel, configs


def _python_fn(jit):
    fn = getattr(jit, "fn", jit)
    if not callable(fn) or not hasattr(fn, "__code__"):
        raise Unsupported(f"triton kernel {jit!r} without Python source")
    return fn


def written_arguments(fn) -> set[str]:
    """The parameters of the kernel function `fn` that reach the address of a store (offsets
    included: the tensor arguments among them are the tensors the kernel may write)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return set(inspect.signature(fn).parameters)  # no source: every argument
    params = set(inspect.signature(fn).parameters)
    sources: dict[str, set[str]] = {p: {p} for p in params}  # name -> parameters it derives from
    stored: set[str] = set()

    def derived(expr) -> set[str]:
        out = set()
        for n in ast.walk(expr):
            if isinstance(n, ast.Name):
                out |= sources.get(n.id, set())
        return out

    # Assignments in source order, twice, so that loops carry pointers forward.
    for _ in range(2):
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            sources.setdefault(n.id, set()).update(derived(node.value))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
            node.func, "id", "")
        is_tl = isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
            and node.func.value.id in ("tl", "triton", "language")
        if name in _STORE_FNS:
            first = node.args[0] if node.args else next(
                (k.value for k in node.keywords if k.arg == "pointer"), None)
            if first is not None:
                stored |= derived(first)
        elif not is_tl and name not in ("range", "min", "max", "len", "int", "float", "print"):
            for a in [*node.args, *(k.value for k in node.keywords)]:
                stored |= derived(a)  # another function may store through what it is given
    return stored


def _register_op():
    """Define ember::triton_kernel once (the launch as a functional operator)."""
    global _library
    if _library is not None:
        return
    lib = torch.library.Library("ember", "FRAGMENT")
    lib.define("triton_kernel(str kernel, Tensor[] tensors, int[] written) -> Tensor[]")
    lib.impl("triton_kernel", _launch, "CompositeExplicitAutograd")
    torch.library.register_fake("ember::triton_kernel", _fake, lib=lib)
    _library = lib


def _clone(t):
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)


def _fake(kernel, tensors, written):
    return [torch.empty_strided(tensors[i].shape, tensors[i].stride(), dtype=tensors[i].dtype,
                                device=tensors[i].device) for i in written]  # fmt: skip


def _launch(kernel, tensors, written):
    try:
        fn, grids, config_names, constants = _TABLE[kernel]
    except KeyError:
        raise RuntimeError(f"triton kernel {kernel} was captured in another process; a graph "
                           "with user Triton kernels runs only where it was traced") from None
    tensors = list(tensors)
    for i in written:
        tensors[i] = _clone(tensors[i])
    it = iter(tensors)
    args, kwargs = [], {}
    for name, value in constants:
        v = next(it) if value is _TENSOR else value
        if isinstance(name, int):
            args.append(v)
        else:
            kwargs[name] = v

    def grid(meta):
        return grids[tuple(meta[k] for k in config_names)]

    fn[grid](*args, **kwargs)
    return [tensors[i] for i in written]


class _Tensor:
    def __repr__(self):
        return "<tensor>"


_TENSOR = _Tensor()


def launch(tx, vt: TritonLaunchVT, args, kwargs) -> V.VT:
    """Record `kernel[grid](*args, **kwargs)`."""
    from .calls import call, const_of, wrap_const

    kernel = vt.kernel_vt.obj
    jit, configs = _jit_function(kernel)
    fn = _python_fn(jit)
    params = list(inspect.signature(fn).parameters)
    name = fn.__name__
    if len(args) > len(params) or any(k not in params for k in kwargs):
        # autotune configs supply the rest; anything else is the user's error (eager raises)
        extra = [k for k in kwargs if k not in params]
        raise Unsupported(f"triton kernel {name}: unknown arguments {extra or len(args)}")
    meta = {params[i]: a for i, a in enumerate(args)}  # what a grid function reads
    meta.update(kwargs)
    tensors = []
    layout = [*enumerate(args), *kwargs.items()]
    constants = []
    for key, a in layout:
        if isinstance(a, V.TensorVT):
            tensors.append(a)
            constants.append((key, _TENSOR))
        else:
            value = const_of(a, f"argument {params[key] if isinstance(key, int) else key} of "
                                f"triton kernel {name}")  # fmt: skip
            constants.append((key, value))
    written_names = written_arguments(fn)
    tensor_names = [params[k] if isinstance(k, int) else k for k, v in constants if v is _TENSOR]
    written = [i for i, n in enumerate(tensor_names) if n in written_names]
    for i in written:
        if torch.is_grad_enabled() and tensors[i].example.requires_grad:
            raise Unsupported(f"triton kernel {name} may write {tensor_names[i]}, a tensor that "
                              "requires grad")  # fmt: skip
        storage = _storage(tensors[i])
        if any(j != i and _storage(t) == storage for j, t in enumerate(tensors)):
            # the kernel would read what it writes; on private copies it would not
            raise Unsupported(f"triton kernel {name} may write {tensor_names[i]}, which shares "
                              "memory with another of its tensor arguments")  # fmt: skip
    # The grid: one entry per autotuning config (keyed by that config's values).
    config_list = [c.kwargs for c in configs] if configs else [{}]
    config_names = tuple(sorted(config_list[0]))
    grids = {}
    for cfg in config_list:
        if tuple(sorted(cfg)) != config_names:
            raise Unsupported(f"triton kernel {name}: autotune configs set different names")
        grid_vt = vt.grid_vt
        if not isinstance(grid_vt, (V.ConstVT, V.ListVT)):
            items = {k: a for k, a in meta.items()}
            items.update({k: wrap_const(v) for k, v in cfg.items()})
            grid_vt = call(tx, grid_vt, [V.DictVT(items)], {})
        g = const_of(grid_vt, f"grid of triton kernel {name}")
        g = tuple(g) if isinstance(g, (tuple, list)) else (g,)
        if not all(isinstance(x, int) for x in g):
            raise Unsupported(f"triton kernel {name}: grid {g!r} is not a tuple of ints")
        grids[tuple(cfg[k] for k in config_names)] = g
    key = _table_key(kernel, jit, fn, grids, config_names, constants)
    with _LOCK:
        _TABLE.setdefault(key, (kernel, grids, config_names, tuple(constants)))
    _record_for_native_runtimes(key, kernel, fn, params, constants, configs, config_names, grids)
    _register_op()
    detached = [t if not t.example.requires_grad else
                tx.output.call("call_method", "detach", (t,), {}) for t in tensors]  # fmt: skip
    op = torch.ops.ember.triton_kernel.default
    new = tx.output.call("call_function", op, (V.ConstVT(key), V.ListVT(detached),
                                               wrap_const(written)), {})  # fmt: skip
    from .calls import getitem

    for j, i in enumerate(written):
        value = getitem(tx, new, V.ConstVT(j))
        tx.output.call("call_method", "copy_", (tensors[i], value), {})
    return V.ConstVT(None)


def _record_for_native_runtimes(key, kernel, fn, params, constants, configs, config_names, grids):
    """The launch in ember.ir's table, for ember.inductor to compile ahead of time (a cubin the
    C++ wrapper and CUDA packages launch): arguments by parameter name, one entry per config."""
    from ember.ir import native_kernels as nk

    arguments, n_tensors = [], 0
    for k, value in constants:
        name = params[k] if isinstance(k, int) else k
        if value is _TENSOR:
            value, n_tensors = nk.TENSOR(n_tensors), n_tensors + 1
        arguments.append((name, value))
    plain = [sys.modules["triton"].Config({}, num_warps=4, num_stages=3)]  # triton's defaults
    entries = tuple(nk.TritonConfig(dict(c.kwargs), int(c.num_warps), int(c.num_stages),
                                    grids[tuple(c.kwargs[n] for n in config_names)])
                    for c in (configs or plain))  # fmt: skip

    def chosen() -> int:  # autotuning's pick, once it ran in this process
        best = getattr(kernel, "best_config", None)
        return next((i for i, c in enumerate(configs or ()) if c is best), 0)

    nk.register_triton_launch(key, nk.TritonLaunch(fn.__qualname__, fn, tuple(arguments),
                                                   entries, chosen))  # fmt: skip


def _storage(t: V.TensorVT):
    return t.example.untyped_storage().data_ptr() if t.example.numel() else id(t)


def _table_key(kernel, jit, fn, grids, config_names, constants) -> str:
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = repr(fn.__code__.co_code)
    text = repr((getattr(jit, "cache_key", None), source, fn.__module__, fn.__qualname__,
                 [getattr(c, "all_kwargs", lambda: c)() for c in getattr(kernel, "configs", [])],
                 sorted(grids.items()), config_names, constants))  # fmt: skip
    return f"{fn.__qualname__}:{hashlib.sha256(text.encode()).hexdigest()[:20]}"
