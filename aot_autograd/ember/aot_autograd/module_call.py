"""The hot path of a compiled module call: `(*args) -> outputs` with the module's state lifted.

`aot_module` and `aot_module_simplified` trace `functional_call(module, {**params, **buffers},
args)`, whose flat inputs are the parameters, the buffers, then the arguments. A call here builds
that flat tuple from slots found once (no `named_parameters()` walk, no pytree) and finds the
runtime by one of two keys:

- keyed (default): `signature.tensor_key` of the flat tuple, a C-level pass over the tensors;
  any change of sizes, strides, dtype, device, requires_grad or mode retraces.
- guarded: the caller's guards (a dynamo frontend's) already pin every tensor's sizes, strides,
  dtype, device and requires_grad, so only the mode state (grad, inference, autocast), which
  such guards may leave out, is looked up. Opt in with `guarded=True`, or by the graph module's
  `meta[GUARDED_INPUTS_META]`; `config.verify_guarded` checks the promise on every call.

Anything the hot path cannot take (keyword or non-tensor arguments, a state slot that is gone)
goes through `AOTFunction.runtime_for` with pytree, as before.
"""

from __future__ import annotations

import dataclasses
import operator
import os
import warnings
from typing import Callable, Optional

import torch
import torch.nn as nn
from torch.utils import _pytree as pytree

# gm.meta key a frontend sets (True) when its guards pin every input's tensor metadata.
from ember.ir import GUARDED_INPUTS_META_KEY as GUARDED_INPUTS_META

from .runtime import MutatedAliasingError
from .signature import mode_state, split_tensor_key, tensor_key


@dataclasses.dataclass
class CallConfig:
    """Knobs of the call path. EMBER_AOT_VERIFY_GUARDED=1 sets verify_guarded."""

    # In guarded mode, still key every call and raise if the caller's promise was broken.
    verify_guarded: bool = dataclasses.field(
        default_factory=lambda: os.environ.get("EMBER_AOT_VERIFY_GUARDED", "0") not in ("", "0")
    )


config = CallConfig()


class GuardViolation(RuntimeError):
    """A guarded call whose inputs differ from the ones its caller's guards promised."""


def module_state(module: nn.Module) -> tuple[dict, dict]:
    """The module's parameters and buffers by name (the functional call's first two arguments)."""
    return dict(module.named_parameters()), dict(module.named_buffers())


# Bumped by torch's global registration hooks whenever any module registers (or reassigns) a
# parameter, buffer or submodule: a call re-finds its state slots only when this moved.
_state_generation = 0
_hooks_installed = False


def _bump_generation(module, name, value):
    global _state_generation
    _state_generation += 1


def _install_registration_hooks() -> None:
    global _hooks_installed
    if not _hooks_installed:
        from torch.nn.modules import module as torch_module

        torch_module.register_module_parameter_registration_hook(_bump_generation)
        torch_module.register_module_buffer_registration_hook(_bump_generation)
        torch_module.register_module_module_registration_hook(_bump_generation)
        _hooks_installed = True


def _state_reader(module: nn.Module) -> Optional[Callable[[], tuple]]:
    """A function reading the state's tensors in `module_state` order; None if there are none."""
    slots = []
    named = (("_parameters", module.named_parameters), ("_buffers", module.named_buffers))
    for kind, members in named:
        for name, _ in members():
            owner, _, leaf = name.rpartition(".")
            slots.append((getattr(module.get_submodule(owner), kind), leaf))
    if not slots:
        return None
    # A reassigned parameter (`mod.weight = nn.Parameter(...)`) is read afresh on every call.
    read = lambda: tuple([table[leaf] for table, leaf in slots])  # noqa: E731
    read.slots = [(id(table), leaf) for table, leaf in slots]
    return read


def _slots_of(reader) -> list:
    return reader.slots if reader is not None else []


def module_caller(module: nn.Module, compiled, guarded: bool = False,
                  eager_fallback: bool = False) -> Callable:  # fmt: skip
    """`run(*args, **kwargs) -> compiled(params, buffers, *args, **kwargs)`, fast for tensors.
    `eager_fallback`: a signature whose compile raises NotImplementedError runs eagerly (with a
    warning) instead of raising."""
    _install_registration_hooks()
    read_state, generation = _state_reader(module), _state_generation
    by_key: dict = {}  # tensor_key -> runtime.call
    by_mode: dict = {}  # guarded: mode_state -> (runtime.call, its tensor_key)

    def general(args, kwargs):
        params, buffers = module_state(module)
        flat, in_spec = pytree.tree_flatten(((params, buffers, *args), kwargs))
        try:
            return compiled.runtime_for(flat, in_spec), flat
        except NotImplementedError as e:
            # Compiled at the first call, after dynamo's capture: eager, as a capture the
            # backend refuses is (fullgraph=True: raised, as there).
            if not eager_fallback or isinstance(e, MutatedAliasingError):
                raise  # (aliased arguments: a property of this call, not of the program: run)
            return compiled.eager_runtime_for(flat, in_spec, e), flat

    def miss(args: tuple, flat: Optional[tuple], key):
        nonlocal read_state
        runtime, full = general(args, {})
        if key is None:  # not all tensors: this call alone, through the general path
            return lambda _: runtime.call(tuple(a for a in full if isinstance(a, torch.Tensor)))
        if len(full) != len(flat) or not all(map(operator.is_, full, flat)):
            # The module's set of parameters or buffers changed since the slots were found.
            read_state = _state_reader(module)
            by_key.clear()
            by_mode.clear()
            return lambda _: runtime.call(tuple(full))
        by_key[key] = runtime.call
        if guarded:
            by_mode[key[-3:]] = (runtime.call, key)
        return runtime.call

    def _refresh(old):
        new = _state_reader(module)
        if _slots_of(new) != _slots_of(old):
            by_key.clear()
            by_mode.clear()
            return new
        return old

    warned: list = []

    def run(*args, **kwargs):
        try:
            if kwargs:
                runtime, flat = general(args, kwargs)
                return runtime.call(tuple(a for a in flat if isinstance(a, torch.Tensor)))
            nonlocal read_state, generation
            if generation != _state_generation:  # some module's state changed: is it ours?
                read_state, generation = _refresh(read_state), _state_generation
            try:
                flat = read_state() + args if read_state is not None else args
            except KeyError:  # a parameter or buffer was deleted: the general path says what then
                flat = None
            if guarded and flat is not None:
                entry = by_mode.get(mode_state())
                if entry is not None:
                    if config.verify_guarded and tensor_key(flat) != entry[1]:
                        raise GuardViolation(_violation_message(entry[1], tensor_key(flat)))
                    return entry[0](flat)
            key = tensor_key(flat) if flat is not None else None
            call = by_key.get(key)
            if call is None:
                call = miss(args, flat, key)
            return call(flat)
        except MutatedAliasingError as e:
            # A mutated argument shares its storage with another (two views of one buffer):
            # the compiled program assumed distinct inputs; this call runs the graph as written.
            if not eager_fallback:
                raise
            if not warned:
                warned.append(True)
                warnings.warn(f"ember.compile: a call runs eagerly: {e}")
            return module(*args, **kwargs)

    run.aot_function = compiled  # the trace cache and graphs, for inspection
    run.guarded = guarded
    return run


def _violation_message(expected: tuple, got: Optional[tuple]) -> str:
    if got is None:
        return "aot_autograd: a guarded call got a non-tensor argument"
    (e_meta, e_strides, _), (g_meta, g_strides, _) = map(split_tensor_key, (expected, got))
    if len(e_meta) != len(g_meta):
        return f"aot_autograd: guarded call with {len(g_meta)} inputs, promised {len(e_meta)}"
    for i, (e, g) in enumerate(zip(e_meta, g_meta)):
        if e != g:
            return f"aot_autograd: guarded call: flat input {i} is {g}, the guards promised {e}"
    for i, (e, g) in enumerate(zip(e_strides, g_strides)):
        if e != g:
            return f"aot_autograd: guarded call: flat input {i} has strides {g}, promised {e}"
    return "aot_autograd: guarded call whose inputs differ from the promised ones"
