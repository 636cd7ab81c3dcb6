"""Repro files: a standalone Python script holding a graph as torch code, its input specs, the
backend (by name) and the failure; written by the hook and the CLI, read back by the CLI."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import inspect
import re
import runpy
import sys
import types
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

from .checks import Failure
from .graphs import TensorSpec, annotate, make_inputs


class ReproError(RuntimeError):
    """A graph that cannot be written as a repro file, or a repro file that cannot be read."""


@dataclasses.dataclass
class BackendRef:
    """How a repro file finds the backend: its registry name (or "module:function"), the module
    that registers it (name and file), and the keyword arguments (mode=, options=) it was given."""

    name: Optional[str]
    module: Optional[tuple] = None
    options: dict = dataclasses.field(default_factory=dict)


def backend_ref(backend: Callable) -> BackendRef:
    """The BackendRef of a compiler function (a registered one, or one a module defines)."""
    from .. import backends

    options = {}
    while isinstance(backend, functools.partial):
        options = {**backend.keywords, **options}
        backend = backend.func
    module = inspect.getmodule(backend) or inspect.getmodule(type(backend))
    if module is not None and module.__name__ == "__main__":
        module = None  # the user's script: importing it again would run it
    where = (module.__name__, getattr(module, "__file__", None)) if module else None
    for name, fn in backends._REGISTRY.items():
        if fn is backend:
            return BackendRef(name, where, options)
    qualname = getattr(backend, "__qualname__", "")
    if module is not None and qualname and "<locals>" not in qualname:
        return BackendRef(f"{module.__name__}:{qualname}", where, options)
    return BackendRef(None, where, options)


def backend_by_name(name: Optional[str], module: Optional[tuple] = None,
                    options: Optional[dict] = None) -> Callable:  # fmt: skip
    """The backend a repro file names: a registry name (its module `(name, file)` imported
    first, so a backend registered there is found) or "module:function"."""
    from ..backends import _REGISTRY, BackendNotFound, lookup_backend

    if name is None:
        raise ReproError("the backend was neither registered by name nor defined at the top level "
                         "of a module: register it with ember.dynamo.register_backend(name, fn) "
                         "and set BACKEND")  # fmt: skip
    if ":" in name:
        module_name, _, qualname = name.partition(":")
        fn = _import(module_name, module[1] if module else None)
        for part in qualname.split("."):
            fn = getattr(fn, part)
    else:
        if name not in _REGISTRY and module is not None:
            _import(*module)
        try:
            fn = lookup_backend(name)
        except BackendNotFound as e:
            if module is not None:
                raise
            raise ReproError(f"{e}: it was registered by the script that wrote this repro; "
                             "register it here (ember.dynamo.register_backend) or set "
                             "BACKEND_MODULE to (module name, file) of a module that does") from None
    return functools.partial(fn, **options) if options else fn


def _import(module_name: str, file: Optional[str]):
    try:
        return importlib.import_module(module_name)
    except ImportError:
        if not file or not Path(file).is_file():
            raise
    spec = importlib.util.spec_from_file_location(module_name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def _global_lines(globals_: dict, src: str) -> list:
    """Statements defining the names the graph's code uses (torch itself is imported apart)."""
    lines = []
    for name, obj in globals_.items():
        if (obj is torch and name == "torch") or not re.search(rf"\b{re.escape(name)}\b", src):
            continue
        if isinstance(obj, types.ModuleType):
            lines.append(f"import {obj.__name__} as {name}")
        elif isinstance(obj, float):
            lines.append(f"{name} = float({str(obj)!r})")
        elif obj is type(None):
            lines.append(f"{name} = type(None)")
        else:
            module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
            if not module or not qualname or "<" in qualname:
                raise ReproError(f"the graph calls {obj!r}, which cannot be imported by name")
            lines.append(f"import {module}" if module != "torch" else "")
            lines.append(f"{name} = {module}.{qualname}")
    return [line for line in lines if line]


def graph_source(gm: fx.GraphModule) -> str:
    """`class Repro(torch.nn.Module)` whose forward is the graph's code, with what it imports."""
    for node in gm.graph.nodes:
        if node.op in ("get_attr", "call_module"):
            raise ReproError(f"the graph reads attributes of its module ({node.format_node()})")
    code = gm.graph.python_code(root_module="self")
    body = "\n".join(("    " + line).rstrip() for line in code.src.strip("\n").splitlines())
    head = "\n".join(_global_lines(code.globals, code.src))
    head = f"{head}\n\n\n" if head else "\n"
    where = [f"#   {n.name}: {n.meta['ember_where']}" for n in gm.graph.nodes
             if n.op != "placeholder" and n.meta.get("ember_where")]  # fmt: skip
    if where:
        head += "# Where each call was traced:\n" + "\n".join(where) + "\n\n\n"
    return f"{head}class Repro(torch.nn.Module):\n{body}"


_TEMPLATE = '''"""{title}

{details}
Written by ember.dynamo.minifier. Run it (`python {filename}`) to reproduce the failure; minify it
(again) with `python -m ember.dynamo.minifier {filename}`.
"""

import torch

from ember.dynamo.minifier import (TensorSpec, backend_by_name, check, load_inputs, make_inputs,
                                   trace)

{graph}

# One per argument of forward: shape, stride, dtype, device, requires_grad, range of the values.
INPUTS = [
{inputs}
]
INPUT_VALUES = {input_values!r}  # a file of saved values (random ones did not reproduce), or None
BACKEND = {backend!r}  # a registry name, or "module:function"
BACKEND_MODULE = {module!r}  # imported first: where the backend is registered
BACKEND_OPTIONS = {options}
MODE = {mode!r}  # "error": the backend raises EXPECTED; "accuracy": its result differs from eager
# Error mode: (exception type, first line of its message), compared with numbers masked.
EXPECTED = {expected!r}
TOLERANCE = {tolerance!r}  # accuracy mode: relative and absolute tolerance


if __name__ == "__main__":
    inputs = load_inputs(__file__, INPUT_VALUES) if INPUT_VALUES else make_inputs(INPUTS)
    gm = trace(Repro(), inputs)  # the fx graph, each node carrying dynamo's metadata
    backend = backend_by_name(BACKEND, BACKEND_MODULE, BACKEND_OPTIONS)
    check(MODE, gm, inputs, backend, EXPECTED, TOLERANCE)
'''


def write_repro(path, gm: fx.GraphModule, specs: list, backend: BackendRef, mode: str,
                expected: Optional[Failure], *, title: str, details: str = "",
                input_values: Optional[list] = None, tolerance: float = 1e-3) -> Path:  # fmt: skip
    """Write the repro file `path` (and, with `input_values`, the values beside it)."""
    path = Path(path)
    values_name = None
    if input_values is not None:
        values_name = path.stem + "_inputs.pt"
        torch.save([x.detach() if isinstance(x, torch.Tensor) else x for x in input_values],
                   path.with_name(values_name))  # fmt: skip
    options = repr(backend.options)
    try:
        eval(options, {"torch": torch})  # noqa: S307  (the options must read back)
    except Exception:  # noqa: BLE001
        options = "{}  # the options it had (" + options.replace("\n", " ") + ") do not read back"
    text = _TEMPLATE.format(
        title=_docstring_safe(title), details=_docstring_safe(details), filename=path.name,
        graph=graph_source(gm),
        inputs="\n".join(f"    {_spec_source(s)}," for s in specs), input_values=values_name,
        backend=backend.name, module=backend.module, options=options, mode=mode,
        expected=(expected.type_name, expected.message) if expected else None,
        tolerance=tolerance,
    )  # fmt: skip
    path.write_text(text)
    return path


def _docstring_safe(text: str) -> str:
    """`text` as it may appear in a docstring (an error message may hold quotes, backslashes)."""
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


def _spec_source(spec) -> str:
    return spec.source() if isinstance(spec, TensorSpec) else repr(spec)


def load_inputs(repro_file, values_file: str) -> list:
    """The saved input values a repro file names (a path relative to the file)."""
    return torch.load(Path(repro_file).with_name(values_file), weights_only=False)


class _FactoryCalls(TorchFunctionMode):
    """While tracing, a torch call with no traced argument (`torch.ones(3)`) becomes a node
    too, as in dynamo's graphs, instead of a constant tensor of the traced module."""

    def __init__(self, tracer: fx.Tracer):
        super().__init__()
        self.tracer = tracer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(isinstance(a, fx.Proxy) for a in pytree.tree_leaves((args, kwargs))):
            return func(*args, **kwargs)
        return self.tracer.create_proxy("call_function", func, args, kwargs)


def trace(module: torch.nn.Module, inputs) -> fx.GraphModule:
    """The fx graph of `module.forward` (a repro's graph code), each node given an
    `example_value` and TensorMeta computed from `inputs`."""
    tracer = fx.Tracer()
    with _FactoryCalls(tracer):
        graph = tracer.trace(module)
    gm = fx.GraphModule(module, graph)
    annotate(gm, inputs)
    return gm


@dataclasses.dataclass
class ReproFile:
    """A repro file read back: its graph module class and settings."""

    path: Path
    module_class: type
    specs: list
    input_values: Optional[str]
    backend: BackendRef
    mode: str
    expected: Optional[Failure]
    tolerance: float

    def inputs(self) -> list:
        if self.input_values:
            return load_inputs(self.path, self.input_values)
        return make_inputs(self.specs)


def load_repro(path) -> ReproFile:
    """Read a repro file (without running its main block)."""
    path = Path(path)
    if not path.is_file():
        raise ReproError(f"no repro file at {path}")
    ns = runpy.run_path(str(path), run_name="ember_repro")
    try:
        expected = ns["EXPECTED"]
        return ReproFile(path, ns["Repro"], list(ns["INPUTS"]), ns.get("INPUT_VALUES"),
                         BackendRef(ns["BACKEND"], ns.get("BACKEND_MODULE"),
                                    dict(ns.get("BACKEND_OPTIONS") or {})),
                         ns["MODE"], Failure(*expected) if expected else None,
                         ns.get("TOLERANCE", 1e-3))  # fmt: skip
    except KeyError as e:
        raise ReproError(f"{path} is not an ember repro file (no {e.args[0]})") from None
