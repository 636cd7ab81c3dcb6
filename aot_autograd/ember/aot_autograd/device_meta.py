"""Values without data that report a real device: what a metadata trace runs the program on.

A `DeviceMeta` tensor says it is on the input's device ("cpu", "cuda:0") and holds a meta
tensor of its sizes, strides and dtype as its value; every op on it runs on that value and its
results are DeviceMeta tensors again. So everything torch decides by device is decided as on
real tensors: its dispatch keys are the device's (autocast casts it, autograd runs a CUDA
backward on the device's worker thread), and composite ops read `.device` and `.is_cuda` (cuDNN
batch norm, fused dropout, attention's kernel choice), as primtorch's decompositions do (the
dtype of norm statistics). Plain meta tensors, which report "meta", changed those decisions.

`MetaCompute`, a dispatch mode below the tracer, makes the tensors a program creates on the
traced devices (`torch.arange(n, device=x.device)`, a decomposition's `full`) DeviceMeta too, and
turns real tensors that meet DeviceMeta ones into meta tensors for the op (a lifted constant);
a real CPU scalar is passed as it is (its value and its "wrapped number" type promotion).
Anything that needs data raises `NeedsRealValues`: reading a value (`.item()`, `nonzero`), an
op writing a real tensor (any argument its schema marks written, returned or not), an op changing
a tensor's sizes in place.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

_META = torch.device("meta")


class NeedsRealValues(Exception):
    """A trace without data reached something that needs the tensors' values."""


class DeviceMeta(torch.Tensor):
    """A tensor that reports `device` and whose value is `on_meta`, a meta tensor of the same
    sizes, strides, storage offset and dtype. Ops compute on the value (sizes and dtypes only)."""

    @staticmethod
    def __new__(cls, on_meta: torch.Tensor, device, requires_grad: bool = False):
        r = torch.Tensor._make_wrapper_subclass(
            cls, on_meta.shape, strides=on_meta.stride(), storage_offset=on_meta.storage_offset(),
            dtype=on_meta.dtype, device=device, requires_grad=requires_grad,
        )  # fmt: skip
        r.on_meta = on_meta
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    def untyped_storage(self):
        """The value's (meta) storage: views of one tensor share it, so joint's aliasing and the
        tracer's stale views see them as they see views of a real tensor (the wrapper's own
        storage, one per tensor, has no bytes and no identity shared with its views)."""
        return self.on_meta.untyped_storage()

    def __repr__(self):
        return f"DeviceMeta(size={tuple(self.shape)}, dtype={self.dtype}, device={self.device})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return on_meta(func, args, kwargs or {})


def without_data(t: torch.Tensor) -> DeviceMeta:
    """A DeviceMeta tensor of t's sizes, strides, dtype, device and requires_grad."""
    value = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=_META)
    return DeviceMeta(value, t.device, t.requires_grad)


def holds_no_data(t) -> bool:
    """Whether `t` is a DeviceMeta tensor (or a plain meta one)."""
    return isinstance(t, torch.Tensor) and (type(t) is DeviceMeta or t.is_meta)


class MetaCompute(TorchDispatchMode):
    """Ops on DeviceMeta tensors, and tensors made on one of `devices`, computed on meta values
    (a mode below the tracer: what the tracer runs reaches it, whatever the tensors are)."""

    def __init__(self, devices):
        super().__init__()
        self.devices = {torch.device(d) for d in devices}
        # a device named without its index ("cuda") is the current one, as the inputs' are
        self.unindexed = {d.type for d in self.devices}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if DeviceMeta in types:
            if len(types) > 1 and any(t is not DeviceMeta for t in types):
                return NotImplemented  # another subclass (SymbolicTensor) unwraps itself first
            return on_meta(func, args, kwargs)
        if func in _FACTORIES or _is_factory(func):
            device = kwargs.get("device")
            device = torch.get_default_device() if device is None else torch.device(device)
            if device in self.devices or (device.index is None and device.type in self.unindexed):
                return on_meta(func, args, kwargs)
        return func(*args, **kwargs)


_FACTORIES: set = set()
_NOT_FACTORIES: set = set()


def _is_factory(func) -> bool:
    """Whether `func` makes a tensor from no tensor (it takes a device and no tensor)."""
    if func in _NOT_FACTORIES:
        return False
    arguments = func._schema.arguments
    made = any(a.name == "device" for a in arguments) and not any(
        "Tensor" in str(a.type) for a in arguments)  # fmt: skip
    (_FACTORIES if made else _NOT_FACTORIES).add(func)
    return made


# Ops that read tensor data: on a value without data they would fail, or answer wrongly.
_READS_DATA = {
    aten._local_scalar_dense.default, aten.nonzero.default, aten.equal.default,
    aten.is_nonzero.default, aten.allclose.default,
}  # fmt: skip


def on_meta(func, args, kwargs):
    """`func` computed on the meta values of its tensors; its tensor results as DeviceMeta on
    the device torch would put them on (the `device` argument, else the inputs')."""
    answer = _ANSWERS.get(func)
    if answer is not None:
        return answer(*args, **kwargs)
    if func in _READS_DATA:
        raise NeedsRealValues(f"{func} reads tensor data")
    sources: dict[int, torch.Tensor] = {}  # id(meta value) -> the tensor it stands for
    devices: list[torch.device] = []

    def meta_of(x):
        if type(x) is DeviceMeta:
            devices.append(x.device)
            sources[id(x.on_meta)] = x
            return x.on_meta
        if isinstance(x, torch.Tensor) and not x.is_meta:
            if x.dim() == 0 and x.device.type == "cpu":
                return x  # a CPU scalar goes with any device, and may be a wrapped number
            devices.append(x.device)
            value = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=_META)
            sources[id(value)] = x
            return value
        return x

    if func._schema.is_mutable:
        _refuse_writing_real(func, args, kwargs)
    m_args, m_kwargs = _tmap(meta_of, (args, kwargs))
    device = kwargs.get("device")
    if device is not None or func in _FACTORIES:
        device = torch.get_default_device() if device is None else torch.device(device)
        m_kwargs["device"] = _META
    else:
        device = _common_device(devices)
    out = func(*m_args, **m_kwargs)
    if func in _CONVOLUTIONS:
        out = _conv_layouts(func, out, m_args)
    if func._schema.is_mutable:
        _check_written(func, args, kwargs)

    def wrap(x):
        if not isinstance(x, torch.Tensor) or not x.is_meta:
            return x
        source = sources.get(id(x))
        if source is None:
            return DeviceMeta(x, device)
        return source  # the op returned an argument (in place, out=): the tensor it stands for

    return _tmap(wrap, out)


def _common_device(devices: list) -> torch.device:
    """The device of an op's results: its tensors' device, a CPU scalar's only when all are."""
    for d in devices:
        if d.type != "cpu":
            return d
    return devices[0] if devices else torch.get_default_device()


def _refuse_writing_real(func, args, kwargs) -> None:
    """Raise before `func` writes a real tensor: its meta stand-in would take the write, so the
    real one would keep stale values while the trace goes on as if written (a batch norm's
    running statistics, an `out=` buffer, a foreach op's list, returned or not)."""
    for i, argument in enumerate(func._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        if argument.kwarg_only or i >= len(args):
            value = kwargs.get(argument.name)
        else:
            value = args[i]
        for x in _leaves(value):
            if isinstance(x, torch.Tensor) and type(x) is not DeviceMeta and not x.is_meta:
                raise NeedsRealValues(f"{func} writes a real tensor from one without data")


def _check_written(func, args, kwargs) -> None:
    for x in _leaves((args, kwargs)):
        if type(x) is DeviceMeta:
            v = x.on_meta
            if x.shape != v.shape or x.stride() != v.stride() or (
                    x.storage_offset() != v.storage_offset()):  # fmt: skip
                raise NeedsRealValues(f"{func} changes a tensor's sizes or strides in place")


def _fused_sdp_choice(query, key, value, attn_mask=None, *args, **kwargs):
    """Attention's kernel choice, asked of real (empty) tensors of the arguments' sizes, strides
    and dtypes on their device: the choice is the device's code (the meta device's answers
    "math"), it reads no data."""
    from torch.utils._python_dispatch import _disable_current_modes

    def real(t):
        if type(t) is not DeviceMeta:
            return t
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)

    with _disable_current_modes():
        tensors = [real(t) for t in (query, key, value, attn_mask)]
        return aten._fused_sdp_choice.default(*tensors, *args, **kwargs)


_ANSWERS = {aten._fused_sdp_choice.default: _fused_sdp_choice}

_CONVOLUTIONS = (aten.convolution.default, aten.convolution_backward.default)


def _conv_layouts(func, out, m_args):
    """A convolution's meta results in the layout the device's kernels give them (primtorch's
    convolution prims say which): torch's meta convolution returns a contiguous output for an
    NHWC input, where the CPU's and cuDNN's kernels return NHWC, and a view a program takes of
    it (`diagonal`, `unfold`: an as_strided) would address the wrong elements."""
    from ember.ir import TensorMeta
    from ember.primtorch.prims.extern import conv_layout

    first = 0 if func is aten.convolution.default else 1  # backward: (grad_output, input, ...)
    inp, weight = (TensorMeta.from_tensor(t) for t in m_args[first : first + 2])

    def laid(t):
        if not isinstance(t, torch.Tensor):
            return t
        strides = tuple(int(v) for v in conv_layout(tuple(t.shape), inp, weight))
        if t.stride() == strides:
            return t
        return torch.empty_strided(t.shape, strides, dtype=t.dtype, device=_META)

    if func is aten.convolution.default:
        return laid(out)
    return (laid(out[0]), laid(out[1]), out[2])

def _leaves(x):
    if isinstance(x, (list, tuple)):
        for v in x:
            yield from _leaves(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)
    else:
        yield x


def _tmap(fn, x):
    # pytree.tree_map for call arguments (lists, tuples, dicts), several times faster: it runs
    # twice for every op of a trace.
    if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        return type(x)(_tmap(fn, v) for v in x)
    if isinstance(x, dict):
        return {k: _tmap(fn, v) for k, v in x.items()}
    return fn(x)
