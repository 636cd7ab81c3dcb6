"""User Triton kernels (`ember::triton_kernel` steps) compiled ahead of time for CUDA artifacts.

ember.dynamo keeps each captured launch of a user's `@triton.jit` kernel in ember.ir's table
(native_kernels.TritonLaunch: the kernel's Python function, its arguments, its autotuning configs
and the grid each gives). For the C++ wrapper and CUDA packages, a CUDA artifact's
`extern.custom_op` step calling `ember::triton_kernel` becomes a Triton kernel of the artifact:

- its source is the user's function as a module of its own (decorators replaced by `@triton.jit`,
  the globals it reads carried along: triton modules, numbers, other jit functions it calls);
- it is compiled for the target like Ember's own kernels (triton_aot.compile_kernel: no GPU, no
  value specialisation), with the launch's constexprs and the chosen config (autotuning's pick
  when it ran in this process, else the first) and pointer types from the buffers' dtypes;
- the step becomes a `kernel` step with the config's grid (sizes are specialised at capture) and
  `copy_in` pairs: as in Python, the kernel writes private copies of the tensors it may write
  (the step's output buffers, filled from the inputs first) and the graph reads those.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import inspect
import os
import re
import textwrap
import types
from typing import Optional

import sympy
import torch

from ember.ir import BufferIR, CompiledArtifact, KernelIR, StepIR
from ember.ir import native_kernels as nk

# torch dtype -> Triton pointer element type.
_POINTER = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
    torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
    torch.uint8: "u8", torch.bool: "i1", torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5",
}  # fmt: skip


def is_user_launch(step) -> bool:
    return (step.kind == "extern" and step.target == "extern.custom_op"
            and isinstance(step.args, (list, tuple)) and step.args
            and step.args[0] == nk.TRITON_KERNEL_OP)  # fmt: skip


def _is_jit(value) -> bool:
    runtime = __import__("sys").modules.get("triton.runtime.jit")
    return runtime is not None and isinstance(value, runtime.KernelInterface)


def _is_constexpr_annotation(ann) -> bool:
    return "constexpr" in (ann if isinstance(ann, str) else getattr(ann, "__name__", str(ann)))


def module_source(fn) -> str:
    """A module holding `fn` as `@triton.jit def <name>` and what it reads from its globals."""
    header = ["import triton", "import triton.language as tl", ""]
    defs: dict[str, str] = {}
    _add_function(fn, fn.__name__, header, defs, fn.__qualname__)
    return "\n".join(header + [""] + list(defs.values())) + "\n"


def _add_function(fn, name, header, defs, owner) -> None:
    if name in defs:
        return
    defs[name] = ""  # placed first: a recursive reference finds it
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        raise NotImplementedError(f"the user Triton kernel {owner}: no Python source for "
                                  f"{fn.__qualname__}, so it cannot be compiled ahead of "
                                  "time") from None  # fmt: skip
    fdef = next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    fdef.decorator_list, fdef.name = [], name
    stored = {n.id for n in ast.walk(fdef) if isinstance(n, ast.Name)
              and not isinstance(n.ctx, ast.Load)}  # fmt: skip
    params = {a.arg for a in [*fdef.args.args, *fdef.args.kwonlyargs, *fdef.args.posonlyargs]}
    closure = inspect.getclosurevars(fn)
    scope = {**closure.globals, **closure.nonlocals}
    for node in ast.walk(fdef):
        if not isinstance(node, ast.Name) or not isinstance(node.ctx, ast.Load):
            continue
        ref = node.id
        if ref in params or ref in stored or ref in defs and ref != name or ref in ("triton", "tl"):
            continue
        if ref not in scope:
            if hasattr(builtins, ref):
                continue
            raise NotImplementedError(f"the user Triton kernel {owner} reads {ref!r}, which "
                                      "its function cannot see")  # fmt: skip
        _add_global(ref, scope[ref], header, defs, owner)
    defs[name] = "@triton.jit\n" + ast.unparse(fdef) + "\n"


def _add_global(ref, value, header, defs, owner) -> None:
    if isinstance(value, types.ModuleType):
        header.append(f"import {value.__name__} as {ref}")
    elif isinstance(value, (bool, int, float)):  # the compiler reads globals as constexprs only
        header.append(f"{ref} = tl.constexpr({value!r})")
    elif value is None or isinstance(value, str):
        header.append(f"{ref} = {value!r}")
    elif type(value).__name__ == "constexpr" and hasattr(value, "value"):
        header.append(f"{ref} = tl.constexpr({value.value!r})")
    elif _is_jit(value):
        _add_function(getattr(value, "fn", value), ref, header, defs, owner)
    else:
        raise NotImplementedError(
            f"the user Triton kernel {owner} reads the global {ref!r} (a {type(value).__name__}), "
            "which cannot be carried into its ahead-of-time compile: pass it as an argument "
            "(a tl.constexpr parameter)")  # fmt: skip


def _scalar_type(value) -> str:
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise NotImplementedError(f"a user Triton kernel argument {value!r} of type "
                              f"{type(value).__name__}")  # fmt: skip


def launch_plan(launch: nk.TritonLaunch, tensor_dtypes: list, refs: list):
    """(arg_types, step args, constexprs) of a launch, in the kernel's parameter order: tensors
    as `refs[i]` with their pointer type, scalars with theirs, the rest constexprs."""
    config = launch.configs[launch.chosen()]
    passed = dict(launch.arguments)
    signature = inspect.signature(launch.fn)
    arg_types, args, consts = [], [], {}
    for name, param in signature.parameters.items():
        constexpr = _is_constexpr_annotation(param.annotation)
        if name in config.kwargs:
            consts[name] = config.kwargs[name]
        elif name in passed and isinstance(passed[name], nk.TENSOR):
            i = passed[name].index
            if tensor_dtypes[i] not in _POINTER:
                raise NotImplementedError(f"the user Triton kernel {launch.name}: a "
                                          f"{tensor_dtypes[i]} tensor argument {name}")  # fmt: skip
            arg_types.append("*" + _POINTER[tensor_dtypes[i]])
            args.append(refs[i])
        else:
            if name in passed:
                value = passed[name]
            elif param.default is not inspect.Parameter.empty:
                value = param.default
            else:
                raise NotImplementedError(f"the user Triton kernel {launch.name}: no value for "
                                          f"its parameter {name}")  # fmt: skip
            if constexpr or value is None:
                consts[name] = value
            else:
                arg_types.append(_scalar_type(value))
                args.append(value)
    return arg_types, args, consts, config


def attach_user_kernels(artifact: CompiledArtifact, arch: Optional[int] = None) -> CompiledArtifact:
    """A CUDA artifact with every user Triton launch compiled to a cubin and made a kernel step."""
    from . import triton_aot

    if torch.device(artifact.device).type != "cuda" or not any(map(is_user_launch, artifact.steps)):
        return artifact
    plans = {}  # step index -> (launch, arg_types, args, cfg, source)
    for i, step in enumerate(artifact.steps):
        if is_user_launch(step):
            plans[i] = _plan_step(artifact, step)
    jobs = [(p[0].fn.__name__, p[4], list(p[1]), p[3]) for p in plans.values()]
    if os.environ.get("TRITON_INTERPRET") == "1":  # compiled in a clean process (check_kernels)
        failures = triton_aot.check_jobs(jobs, arch or triton_aot.current_arch())
        if failures:
            raise RuntimeError("user Triton kernels failed to compile:\n" + "\n\n".join(failures))
    kernels, steps, buffers = list(artifact.kernels), list(artifact.steps), list(artifact.buffers)
    known = {b.name for b in buffers}
    taken = {k.name for k in kernels}
    for i, (launch, arg_types, args, cfg, source) in plans.items():
        step = artifact.steps[i]
        cubin = triton_aot.compile_kernel(source, launch.fn.__name__, arg_types, cfg, arch)
        name = _unique(re.sub(r"\W", "_", f"user_{launch.name}"), taken)
        config = launch.configs[launch.chosen()]
        kernels.append(KernelIR(name, "triton", source, cubin.name, arg_types,
                                grid=tuple(sympy.Integer(g) for g in config.grid),
                                num_warps=cubin.num_warps, num_stages=config.num_stages,
                                shared_mem=cubin.shared_mem, binary=cubin.path))  # fmt: skip
        _, tensors, written = step.args[1]
        refs = [t["node"] if isinstance(t, dict) else t for t in tensors]
        copy_in = [[out, refs[w]] for w, out in zip(written, step.outputs)]
        for out, src in copy_in:  # a copy nobody reads after the kernel has no buffer in the plan
            if out not in known:
                meta = dataclasses.replace(artifact.buffer(src).meta, storage_offset=0)
                buffers.append(BufferIR(out, "intermediate", meta))
                known.add(out)
        steps[i] = StepIR("kernel", name, args, {"copy_in": copy_in}, tuple(step.outputs))
    return dataclasses.replace(artifact, buffers=tuple(buffers), kernels=tuple(kernels),
                               steps=tuple(steps))


def _plan_step(artifact: CompiledArtifact, step):
    key, tensors, written = step.args[1]
    launch = nk.triton_launch(key)
    if launch is None:
        raise NotImplementedError(f"the user Triton kernel {key.split(':')[0]} was captured in "
                                  "another process: compile and package it where it was "
                                  "traced")  # fmt: skip
    if len(written) != len(step.outputs):
        raise NotImplementedError(f"the user Triton kernel {launch.name}: {len(step.outputs)} "
                                  f"outputs for {len(written)} written tensors")  # fmt: skip
    refs = [t["node"] if isinstance(t, dict) else t for t in tensors]
    fresh = dict(zip(written, step.outputs))  # the kernel writes the step's output buffers
    dtypes = [artifact.buffer(r).meta.dtype for r in refs]
    arg_types, args, consts, config = launch_plan(
        launch, dtypes, [fresh.get(i, r) for i, r in enumerate(refs)])
    cfg = {**consts, "num_warps": config.num_warps, "num_stages": config.num_stages}
    return launch, tuple(arg_types), args, cfg, module_source(launch.fn)


def _unique(name: str, taken: set) -> str:
    candidate, n = name, 0
    while candidate in taken:
        n += 1
        candidate = f"{name}_{n}"
    taken.add(candidate)
    return candidate


__all__ = ["attach_user_kernels", "is_user_launch", "launch_plan", "module_source"]
