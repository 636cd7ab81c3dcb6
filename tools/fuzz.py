"""A differential fuzzer: random small tensor programs, run eagerly and under ember.compile
(inductor with the C++ renderer, or the Triton one under TRITON_INTERPRET=1), compared.

Each program is printed as runnable Python (`make_inputs()` and `program(...)`), so a mismatch is
a reproducer to paste into a test. Programs are grown one statement at a time from a table of
op makers; each candidate statement runs eagerly at once, so shapes and dtypes are known and a
statement eager rejects is simply not kept. A program whose eager run (or eager backward) fails
is skipped; an Ember crash or a wrong value, gradient or input mutation is a mismatch; a clean
refusal (NotImplementedError, a graph the backend does not cover) is counted as unsupported.

    python tools/fuzz.py --seed 0 --count 300 [--minutes 15] [--renderer cpp|triton|both|aot_eager]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
import time
import traceback
from typing import Callable, Optional

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
DTYPES = FLOATS + (torch.int64, torch.int32, torch.bool)
# Weights of the input dtypes: float32 carries most programs (it has the backward too).
DTYPE_WEIGHTS = (5, 1, 1, 1, 1, 1)
SIZES = (0, 1, 1, 2, 3, 3, 4, 5)
# (atol, rtol) per dtype of a compared value: a 16-bit float rounds each fused step differently.
TOLERANCES = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 1e-2),
              torch.bfloat16: (6e-2, 5e-2)}  # fmt: skip


@dataclasses.dataclass
class Program:
    """One generated program: how its inputs are built, its statements, what it returns."""

    seed: int
    inputs: list[str]  # one expression per input, run under torch.manual_seed(seed)
    body: list[str] = dataclasses.field(default_factory=list)
    outputs: list[str] = dataclasses.field(default_factory=list)

    def source(self) -> str:
        """The program as runnable Python source."""
        names = ", ".join(f"a{i}" for i in range(len(self.inputs)))
        lines = ["import torch", "", "", "def make_inputs():",
                 f"    torch.manual_seed({self.seed})", "    return ["]  # fmt: skip
        lines += [f"        {e}," for e in self.inputs] + ["    ]", "", "", f"def program({names}):"]
        lines += [f"    {s}" for s in self.body]
        lines.append(f"    return ({', '.join(self.outputs)},)" if self.outputs else "    return ()")
        return "\n".join(lines) + "\n"

    def load(self) -> tuple[Callable, Callable]:
        """(make_inputs, program) from the printed source (a fresh code object each time)."""
        ns: dict = {}
        exec(compile(self.source(), f"<fuzz program {self.seed}>", "exec"), ns)
        return ns["make_inputs"], ns["program"]


# --- inputs -----------------------------------------------------------------------------------
def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "torch.")


def _input_expr(rng: random.Random, grad: bool) -> str:
    """A random input: rank 0..3, sizes with 0 and 1, any dtype, maybe a strided view."""
    dt = rng.choices(DTYPES, DTYPE_WEIGHTS)[0]
    shape = [rng.choice(SIZES) for _ in range(rng.choice((0, 1, 2, 2, 3, 3)))]
    if rng.random() < 0.85:  # mostly non-empty: empty tensors are a corner, not the common case
        shape = [max(s, 1) for s in shape]
    layout = rng.choice(("plain", "plain", "transposed", "sliced")) if shape else "plain"
    base = list(shape)
    if layout == "transposed" and len(shape) >= 2:
        base[-1], base[-2] = base[-2], base[-1]
    elif layout == "sliced":
        base[-1] = shape[-1] * 2
    else:
        layout = "plain"
    dims = ", ".join(map(str, base)) + ("," if len(base) == 1 else "")
    if dt.is_floating_point:
        e = f"torch.randn(({dims}), dtype={_dtype_name(dt)})"
    elif dt is torch.bool:
        e = f"(torch.rand(({dims})) > 0.5)"
    else:
        e = f"torch.randint(-4, 5, ({dims}), dtype={_dtype_name(dt)})"
    if layout == "transposed":
        e += ".transpose(-1, -2)"
    elif layout == "sliced":
        e += "[..., ::2]"
    if grad and dt is torch.float32 and rng.random() < 0.6:
        e += ".requires_grad_()"
    return e


# --- statements: each maker returns a statement's right-hand side, or None ---------------------
UNARY_FLOAT = ("torch.exp({})", "torch.sin({})", "torch.tanh({})", "torch.sigmoid({})",
               "torch.relu({})", "torch.sqrt({}.abs())", "torch.log1p({}.abs())", "-{}",
               "{}.abs()", "torch.rsqrt({}.abs() + 1)", "{}.clamp(-0.5, 0.5)",
               "torch.nn.functional.gelu({})", "{}.square()")  # fmt: skip
UNARY_INT = ("-{}", "{}.abs()", "{}.clamp(min=0)", "{} * 3", "{}.bitwise_not()")
UNARY_BOOL = ("{}.logical_not()", "{}.int()", "{}.float()")
BINARY = ("{} + {}", "{} - {}", "{} * {}", "torch.maximum({}, {})", "torch.minimum({}, {})")
BINARY_FLOAT = ("{} / ({}.abs() + 1)", "torch.atan2({}, {})")
REDUCTIONS = ("sum", "amax", "amin", "mean", "prod")


def _broadcastable(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        torch.broadcast_shapes(a.shape, b.shape)
        return True
    except RuntimeError:
        return False


def _unary(rng, env, _grad):
    name, t = rng.choice(list(env.items()))
    if t.dtype.is_floating_point:
        return rng.choice(UNARY_FLOAT).format(name)
    return rng.choice(UNARY_BOOL if t.dtype is torch.bool else UNARY_INT).format(name)


def _binary(rng, env, _grad):
    name, t = rng.choice(list(env.items()))
    partners = [n for n, u in env.items() if _broadcastable(t, u) and n != name] or [name]
    other = rng.choice(partners) if partners and rng.random() < 0.8 else repr(rng.choice((2, 0.5)))
    if t.dtype is torch.bool:
        return f"{name} & {other}" if other in env else f"{name}.logical_not()"
    if t.dtype.is_floating_point and rng.random() < 0.3:
        return rng.choice(BINARY_FLOAT).format(name, other)
    return rng.choice(BINARY).format(name, other)


def _reduction(rng, env, _grad):
    name, t = rng.choice([(n, u) for n, u in env.items() if u.ndim > 0] or list(env.items()))
    op = rng.choice(REDUCTIONS)
    if t.ndim == 0:
        return f"{name}.{op}()"
    dims = sorted(rng.sample(range(t.ndim), rng.randint(1, t.ndim)))
    keep = rng.random() < 0.5
    if op in ("amax", "amin") or rng.random() < 0.4:
        return f"{name}.{op}(dim={tuple(dims)!r}, keepdim={keep})".replace(",)", ")")
    if op == "prod":
        return f"{name}.prod(dim={dims[0]}, keepdim={keep})"
    return f"{name}.{op}(dim={dims!r}, keepdim={keep})"


def _view(rng, env, _grad):
    name, t = rng.choice(list(env.items()))
    n = t.ndim
    choices = ["reshape", "unsqueeze"]
    if n >= 2:
        choices += ["transpose", "permute"]
    if n >= 1:
        choices += ["slice", "flatten", "select"]
    if 1 in t.shape:
        choices += ["expand", "squeeze"]
    if t.is_contiguous() and n >= 1:
        choices.append("view")
    kind = rng.choice(choices)
    d = rng.randrange(n) if n else 0
    if kind == "reshape":
        return f"{name}.reshape(-1)" if rng.random() < 0.5 else f"{name}.reshape({(1, *t.shape)})"
    if kind == "unsqueeze":
        return f"{name}.unsqueeze({rng.randint(-n - 1, n)})"
    if kind == "transpose":
        return f"{name}.transpose({d}, {(d + 1) % n})"
    if kind == "permute":
        perm = list(range(n))
        rng.shuffle(perm)
        return f"{name}.permute{tuple(perm)}"
    if kind == "slice":
        start, step = rng.choice((0, 1)), rng.choice((1, 2, 3))
        return f"{name}[{':, ' * d}{start}::{step}]"
    if kind == "flatten":
        return f"{name}.flatten()"
    if kind == "select":
        return f"{name}[{':, ' * d}{rng.choice((0, -1))}]" if t.shape[d] else None
    if kind == "expand":
        return f"{name}.expand({tuple(3 if s == 1 else s for s in t.shape)})"
    if kind == "squeeze":
        return f"{name}.squeeze({list(t.shape).index(1)})"
    return f"{name}.view({tuple(reversed(t.shape)) if n == 1 else (-1,)})"


def _matmul(rng, env, _grad):
    mats = [(n, t) for n, t in env.items() if t.dtype in FLOATS and t.ndim in (2, 3)]
    if not mats:
        return None
    name, t = rng.choice(mats)
    partners = [n for n, u in mats if u.dtype == t.dtype and u.shape[-1] == t.shape[-1]
                and u.ndim == 2]  # fmt: skip
    other = rng.choice(partners) if partners else name
    return f"torch.matmul({name}, {other}.transpose(-1, -2))"


def _cat(rng, env, _grad):
    name, t = rng.choice([(n, u) for n, u in env.items() if u.ndim > 0] or [(None, None)])
    if name is None:
        return None
    d = rng.randrange(t.ndim)
    fits = [n for n, u in env.items() if u.dtype == t.dtype and u.ndim == t.ndim
            and all(a == b for i, (a, b) in enumerate(zip(u.shape, t.shape)) if i != d)]  # fmt: skip
    return f"torch.cat([{name}, {rng.choice(fits)}], dim={d})"


def _where(rng, env, inputs):
    # The condition reads an input (exact values): a computed one rounds differently when fused.
    conds = [n for n in inputs if n in env and env[n].dtype is not torch.bool]
    if not conds:
        return None
    c = rng.choice(conds)
    x = rng.choice([n for n, u in env.items() if _broadcastable(u, env[c])] or [c])
    return f"torch.where({c} > 0, {x}, {rng.choice(('0', '1.5', c))})"


def _cast(rng, env, inputs):
    name = rng.choice(list(env))
    dt = rng.choice(DTYPES)
    if not dt.is_floating_point and env[name].dtype.is_floating_point and name not in inputs:
        return None  # a computed float truncated to an integer differs by rounding noise
    return f"{name}.to({_dtype_name(dt)})"


MAKERS = [(_unary, 4), (_binary, 4), (_reduction, 2), (_view, 3), (_matmul, 1), (_cat, 1),
          (_where, 1), (_cast, 1)]  # fmt: skip


def _inplace(rng, env, inputs, grad_inputs) -> Optional[str]:
    """An in-place op on an input or on a view of one (never one that requires grad)."""
    targets = [n for n in env if n in inputs and n not in grad_inputs]
    if not targets:
        return None
    name, t = rng.choice(targets), None
    t = env[name]
    if t.ndim >= 1 and t.shape[-1] > 1 and rng.random() < 0.5:
        name = f"{name}[..., 1:]" if rng.random() < 0.5 else f"{name}.transpose(0, -1)[0]"
    if t.dtype is torch.bool:
        return f"{name}.logical_not_()"
    # A source that shares memory with its target (a view of it) reads elements the op has
    # already written, in an order torch leaves undefined: never one Ember must match.
    partners = [n for n, u in env.items() if u.dtype == t.dtype and u.ndim <= t.ndim
                and u.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()]  # fmt: skip
    op = rng.choice(("add_", "mul_", "clamp_", "copy_", "sub_"))
    if op == "clamp_":
        return f"{name}.clamp_(min=0)"
    other = rng.choice(partners) if partners and rng.random() < 0.6 else "2"
    return f"{name}.{op}({other})"


# --- generation -------------------------------------------------------------------------------
def generate(seed: int, grad: Optional[bool] = None, max_statements: int = 6) -> Program:
    """A random program that eager runs (its backward too, when an input requires grad)."""
    rng = random.Random(seed)
    grad = rng.random() < 0.5 if grad is None else grad
    prog = Program(seed, [_input_expr(rng, grad) for _ in range(rng.randint(1, 3))])
    make, _ = prog.load()
    env = {f"a{i}": t for i, t in enumerate(make())}
    inputs = set(env)
    grad_inputs = {n for n, t in env.items() if t.requires_grad}
    for k in range(rng.randint(2, max_statements)):
        for _attempt in range(8):
            if rng.random() < 0.12:
                stmt = _inplace(rng, env, inputs, grad_inputs)
                if stmt is None or _try(stmt, env):
                    continue
                prog.body.append(stmt)
                break
            maker = rng.choices([m for m, _ in MAKERS], [w for _, w in MAKERS])[0]
            rhs = maker(rng, env, inputs)
            if rhs is None:
                continue
            var = f"v{k}"
            value = _try(f"{var} = {rhs}", env, var)
            if value is None:
                continue
            env[var] = value
            prog.body.append(f"{var} = {rhs}")
            break
    computed = [n for n in env if n not in inputs] or list(inputs)
    outs = {computed[-1], rng.choice(computed)}
    prog.outputs = sorted(outs, key=list(env).index)
    return prog


def _try(stmt: str, env: dict, var: Optional[str] = None):
    """Run one statement on the example values; its value (or True for a statement), None if
    eager rejects it (or it takes no tensor out)."""
    ns = dict(env, torch=torch)
    try:
        exec(stmt, ns)
    except Exception:  # noqa: BLE001  (eager rejects it: not a program worth keeping)
        return None if var else True
    if var is None:
        env.update({n: ns[n] for n in env})
        return False
    value = ns[var]
    return value if isinstance(value, torch.Tensor) else None


# --- running and comparing --------------------------------------------------------------------
@dataclasses.dataclass
class Outcome:
    """What one program did: "ok", "skip" (eager failed), "unsupported" or "mismatch"."""

    status: str
    detail: str = ""


def _run(fn: Callable, inputs: list) -> tuple[list, list]:
    outs = list(fn(*inputs))
    loss = [o.float().sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    if loss:
        sum(loss).backward()
    return outs, [t.grad if t.requires_grad else None for t in inputs]


def _tolerance(t: torch.Tensor) -> tuple[float, float]:
    return TOLERANCES.get(t.dtype, (0.0, 0.0))


def _compare(what: str, got, want) -> Optional[str]:
    if want is None or got is None:
        return None if got is None and want is None else f"{what}: {got!r} vs {want!r}"
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{what}: {got.dtype}{list(got.shape)} vs eager {want.dtype}{list(want.shape)}"
    atol, rtol = _tolerance(want)
    # A sum over k terms rounds about sqrt(k) times more: scale with the values' magnitude.
    magnitude = want.detach().float().abs().nan_to_num(0, 0, 0)
    scale = float(magnitude.max()) if want.numel() else 0.0
    try:
        torch.testing.assert_close(got.detach(), want.detach(), atol=atol * max(1.0, scale),
                                   rtol=rtol, equal_nan=True)  # fmt: skip
    except AssertionError as e:
        return f"{what}: {str(e).strip().splitlines()[0]} {str(e).strip().splitlines()[-1]}"
    return None


def _crash_summary(e: BaseException) -> str:
    """The innermost exception and the Ember frames nearest to where it was raised."""
    while e.__cause__ is not None:
        e = e.__cause__
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "/ember/" in f.filename]
    where = "; ".join(f"{f.filename.rsplit('/ember/', 1)[1]}:{f.lineno} {f.name}"
                      for f in frames[-3:])  # fmt: skip
    return f"{type(e).__name__}: {str(e)[:300]} (at {where})"


class _HalfOps(TorchDispatchMode):
    """Records the lowest-precision 16-bit float dtype any op of an eager run produces."""

    dtype: Optional[torch.dtype] = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16):
                if self.dtype is not torch.bfloat16:  # bfloat16 has the fewer mantissa bits
                    self.dtype = t.dtype
        return out


def _rounding_only(prog: Program, problems, low, got, want, got_grads, want_grads) -> list[str]:
    """The problems left once values that went through 16-bit floats are judged by that.

    A value computed through float16/bfloat16 intermediates carries their rounding whatever
    dtype it ends in (a float32 input's gradient summed from float16 products), and Ember
    rounds where eager does but in another order (fused, in float32 between the roundings).
    Such a value passes when Ember is within the 16-bit dtype's tolerance of a float64 run of
    the same program, or no further from it than twice eager's error. Programs with no 16-bit
    op keep the strict comparison with eager."""
    make, fn = prog.load()
    try:
        ref_in = [t.detach().double().requires_grad_(t.requires_grad)
                  if t.dtype.is_floating_point else t for t in make()]  # fmt: skip
        ref, ref_grads = _run(fn, ref_in)
    except Exception:  # noqa: BLE001  (no float64 reference: keep the strict verdict)
        return problems
    pairs = [(f"output {i}", g, w, r) for i, (g, w, r) in enumerate(zip(got, want, ref))]
    pairs += [(f"grad of a{i}", g, w, r)
              for i, (g, w, r) in enumerate(zip(got_grads, want_grads, ref_grads))]  # fmt: skip
    left = set(problems)
    for what, g, w, r in pairs:
        mine = [p for p in problems if p.startswith(what + ":")]
        if not mine or not all(isinstance(t, torch.Tensor) for t in (g, w, r)):
            continue
        if g.shape != r.shape:
            continue
        g, w, r = g.detach().double(), w.detach().double(), r.detach().double()
        atol, rtol = TOLERANCES[low]
        scale = float(r.abs().nan_to_num(0, 0, 0).max()) if r.numel() else 0.0
        close = torch.isclose(g, r, rtol=rtol, atol=atol * max(1.0, scale), equal_nan=True)
        ember_err = float((g - r).abs().nan_to_num(0, 0, 0).max()) if r.numel() else 0.0
        eager_err = float((w - r).abs().nan_to_num(0, 0, 0).max()) if r.numel() else 0.0
        nan_same = bool(((g != g) == (r != r)).all() or ((g != g) == (w != w)).all())
        if nan_same and (bool(close.all()) or ember_err <= 2 * eager_err):
            left -= set(mine)
    return [p for p in problems if p in left]


def check(prog: Program, renderer: str = "cpp") -> Outcome:
    """Run `prog` eagerly and compiled (inductor with `renderer` "cpp" or "triton"; "aot_eager":
    aot_autograd's graphs run by eager, no inductor), with its backward; compare."""
    import ember
    from ember.inductor.config import config

    make, fn = prog.load()
    try:
        eager_in = make()
        with _HalfOps() as half:
            want, want_grads = _run(fn, eager_in)
        half_dtype = half.dtype
    except Exception as e:  # noqa: BLE001
        return Outcome("skip", f"eager: {type(e).__name__}: {e}")
    previous, config.cpu_backend = config.cpu_backend, renderer
    try:
        comp_in = make()
        backend = "aot_eager" if renderer == "aot_eager" else "inductor"
        got, got_grads = _run(ember.compile(fn, backend=backend, fullgraph=True), comp_in)
    except Exception as e:  # noqa: BLE001
        text = "".join(traceback.format_exception(e))
        if isinstance(e, NotImplementedError) or "NotImplementedError" in text:
            return Outcome("unsupported", f"{type(e).__name__}: {str(e)[:300]}")
        return Outcome("mismatch", f"crash: {_crash_summary(e)}")
    finally:
        config.cpu_backend = previous
    problems = [_compare(f"output {i}", g, w) for i, (g, w) in enumerate(zip(got, want))]
    problems += [_compare(f"grad of a{i}", g, w) for i, (g, w) in enumerate(zip(got_grads,
                                                                              want_grads))]
    problems += [_compare(f"a{i} after the call", g, w) for i, (g, w) in enumerate(zip(comp_in,
                                                                                    eager_in))]
    problems = [p for p in problems if p]
    if problems and half_dtype is not None:
        problems = _rounding_only(prog, problems, half_dtype, got, want, got_grads, want_grads)
    if len(got) != len(want):
        problems.append(f"{len(got)} outputs vs eager {len(want)}")
    return Outcome("mismatch", "\n".join(problems)) if problems else Outcome("ok")


def fuzz(seed: int, count: int, minutes: Optional[float] = None, renderers=("cpp",),
         log: Callable[[str], None] = print) -> dict:
    """Check `count` programs (seeds seed, seed+1, ...) or until `minutes` pass; a summary."""
    start, counts, mismatches = time.monotonic(), {}, []
    done = 0
    for k in range(count):
        if minutes is not None and time.monotonic() - start > minutes * 60:
            break
        renderer = renderers[k % len(renderers)]
        prog = generate(seed + k)
        out = check(prog, renderer)
        counts[out.status] = counts.get(out.status, 0) + 1
        done += 1
        if out.status == "mismatch":
            mismatches.append((prog, renderer, out))
            log(f"--- mismatch: seed {prog.seed}, renderer {renderer}\n{prog.source()}"
                f"# {out.detail}\n")  # fmt: skip
    elapsed = time.monotonic() - start
    rate = done / (elapsed / 60) if elapsed else 0.0
    log(f"{done} programs in {elapsed:.0f} s ({rate:.1f} per minute): {counts}")
    return {"programs": done, "seconds": elapsed, "per_minute": rate, "counts": counts,
            "mismatches": mismatches}  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--count", type=int, default=None,
                    help="programs to run (default 100; with --minutes, until the time is up)")
    ap.add_argument("--minutes", type=float, default=None)
    ap.add_argument("--renderer", choices=("cpp", "triton", "both", "aot_eager"),
                    default="both", help="both: cpp and triton in turn; aot_eager: no inductor")
    ap.add_argument("--show", action="store_true", help="print each program (not only mismatches)")
    args = ap.parse_args(argv)
    if args.count is None:
        args.count = 100 if args.minutes is None or args.show else sys.maxsize
    if args.show:
        for k in range(args.count):
            print(generate(args.seed + k).source())
        return 0
    renderers = ("cpp", "triton") if args.renderer == "both" else (args.renderer,)
    summary = fuzz(args.seed, args.count, args.minutes, renderers)
    return 1 if summary["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
