"""NumPy values in one frame conversion: its state (inputs, copied views) and the device the arrays
compute on.

Without a default torch device, or with the CPU as it, NumPy values are tensors over the arrays'
own memory on the CPU. Under another default device (`with torch.device("cuda")`,
`torch.set_default_device("cuda")`) the frame's graph computes there: an ndarray input is a copy
on the device made by the transformed code before the graph, every tensor a NumPy call creates is
made there (`device=` on the factory), results come back as host ndarrays (`.cpu().numpy()`),
and a write into an input is copied back into the caller's array after the graph. The default
device is guarded, so a call under another one compiles anew.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch.utils._device import DeviceContext

from . import variables as V
from .exc import Unsupported
from .source import AttrSource, ConstantSource


# -- per-frame state ----------------------------------------------------------------------------
@dataclasses.dataclass
class NumpyState:
    """What one frame conversion knows about its arrays."""

    inputs: dict = dataclasses.field(default_factory=dict)  # id(array) -> (array, NdarrayVT)
    # Storages (of example tensors) that a NumPy view computed here as a copy (np.flip) reads:
    # writes into them would show through the view in NumPy only.
    copied: set = dataclasses.field(default_factory=set)
    device: object = None  # where the arrays compute (array_device); None: the CPU, in place
    device_known: bool = False
    copied_back: set = dataclasses.field(default_factory=set)  # ids of inputs written back


def state(output) -> NumpyState:
    """The NumPy state of the frame `output` is capturing."""
    st = getattr(output, "numpy_state", None)
    if st is None:
        st = output.numpy_state = NumpyState()
    return st


def storage_of(t: V.TensorVT) -> int:
    # the storage object's identity: data pointers are 0 for every empty or meta storage
    return t.example.untyped_storage()._cdata


def copied_view(tx, source: V.NdarrayVT, out: V.NdarrayVT) -> V.NdarrayVT:
    """`out` is a view of `source` in NumPy but a copy here: writes into either break the graph."""
    state(tx.output).copied.add(storage_of(source.tensor))
    out.readonly = True
    return out


# -- the device the arrays compute on -------------------------------------------------------------
class _DefaultDevice:
    """torch's default device for new tensors: the innermost DeviceContext mode's (`with
    torch.device(...)` and torch.set_default_device push one; torch.utils._device.CURRENT_DEVICE
    misses the first), or None. Read by a guard as an attribute, so it is compared by value."""

    @property
    def current(self):
        for i in range(torch._C._len_torch_function_stack() - 1, -1, -1):
            mode = torch._C._get_function_stack_at(i)
            if isinstance(mode, DeviceContext):
                return mode.device
        return None


_DEFAULT_DEVICE_SOURCE = AttrSource(ConstantSource(_DefaultDevice(), "torch default device"),
                                    "current")  # fmt: skip


# Default device types on which the graph works on the arrays' own memory (no copies). Tests
# empty it to run the copying path, values and all, on the CPU.
IN_PLACE_DEVICE_TYPES = {"cpu"}


def array_device(output):
    """The device the frame's NumPy values compute on: torch's default device when it is not the
    CPU, else None (the arrays' own memory, on the CPU). Guarded on first use."""
    st = state(output)
    if not st.device_known:
        current = _DEFAULT_DEVICE_SOURCE.base.obj.current
        output.guards.add("EQ", _DEFAULT_DEVICE_SOURCE, current)
        st.device = (None if current is None or current.type in IN_PLACE_DEVICE_TYPES
                     else _with_index(current))  # fmt: skip
        st.device_known = True
    return st.device


def _with_index(device: torch.device) -> torch.device:
    """`device` as the tensors made on it name it ("cuda" is "cuda:0" on device 0): the arrays
    copied in and the arrays created in the graph must name one device."""
    if device.index is not None or device.type == "meta":
        return device
    return torch.empty(0, device=device).device


def device_kwargs(tx) -> dict:
    """`device=` for a tensor a NumPy call creates (nothing on the CPU: the graph is as before)."""
    device = array_device(tx.output)
    return {} if device is None else {"device": V.ConstVT(device)}


def to_device(array: np.ndarray, device) -> torch.Tensor:
    """A graph input: a copy of `array` on `device` (the transformed code calls this)."""
    return torch.from_numpy(array).to(device)


def copy_to_host(array: np.ndarray, tensor: torch.Tensor) -> None:
    """After the graph: what it wrote into the device copy of input `array`, back into it."""
    torch.from_numpy(array).copy_(tensor)


def copy_back_when_written(tx, a: V.NdarrayVT) -> None:
    """A write into a device input (or a view of one) is copied back into the caller's array
    after the graph (recorded once per input, in program order with the other effects)."""
    st = state(tx.output)
    if st.device is None:
        return
    written = storage_of(a.tensor)
    for array, vt in st.inputs.values():
        if storage_of(vt.tensor) == written and id(array) not in st.copied_back:
            st.copied_back.add(id(array))
            check_no_written_overlap(tx.output, array)
            # the placeholder without its source: codegen passes it out of the graph
            alias = V.TensorVT(vt.tensor.node, vt.tensor.example)
            tx.output.record_side_effect("call", V.BuiltinVT(copy_to_host), [vt, alias], {})


def check_no_written_overlap(output, array: np.ndarray) -> None:
    """Input arrays that overlap in memory are separate copies on the device: fine to read, but
    a write into one would not show through the other (checked at tracing, not guarded)."""
    st = state(output)
    for other, _ in st.inputs.values():
        if other is array or not np.may_share_memory(array, other):
            continue
        if id(array) in st.copied_back or id(other) in st.copied_back:
            raise Unsupported(f"a write into one of two NumPy input arrays that share memory, "
                              f"while arrays compute on {st.device} (each is a separate copy "
                              "there)")  # fmt: skip


def host_array_text(cg, vt: V.NdarrayVT) -> str:
    """Source text rebuilding NumPy value `vt` after the graph: an ndarray over the tensor's
    memory or, computed on a device, a host copy of it; a NumPy scalar when `vt.scalar`."""
    text = cg.expr(vt.tensor)
    if state(cg.output).device is not None:  # every NumPy value of the frame is on the device
        if cg.at_break:
            _check_alone(cg, vt)
        text += ".cpu()"
    return f"{text}.numpy(){'[()]' if vt.scalar else ''}"


def _check_alone(cg, vt: V.NdarrayVT) -> None:
    """At a graph break, the code after it may write into a rebuilt array: a host copy is only
    faithful when no other value the program holds shares the device memory (a view of an input,
    or two views of one array)."""
    storage = storage_of(vt.tensor)
    st = state(cg.output)
    other = cg.host_copies.setdefault(storage, vt)
    shared = other is not vt or any(storage_of(i.tensor) == storage for _, i in st.inputs.values())
    if shared:
        raise Unsupported(f"a graph break with a view of a NumPy array alive, while arrays "
                          f"compute on {st.device} (a host copy would not share its memory)")
