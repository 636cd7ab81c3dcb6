"""DeviceMeta values: no data, the real device reported, and what torch decides by device
decided as for a real tensor of that device (the traces that use them: test_aot_meta_trace.py)."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from ember.aot_autograd import joint
from ember.aot_autograd.device_meta import DeviceMeta, MetaCompute, NeedsRealValues, without_data

aten = torch.ops.aten


class _Ops(TorchDispatchMode):
    """Names the ATen ops that reach the modes (what a composite op chose)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _value(shape, device, dtype=torch.float32):
    return DeviceMeta(torch.empty(shape, dtype=dtype, device="meta"), device)


def test_a_cuda_value_is_dispatched_as_cuda_without_a_gpu():
    """Made on a CPU-only build too: its keys are CUDA's, and dropout takes its fused CUDA
    kernel, where the same value on the CPU runs bernoulli_ (the device's choice, in C++)."""
    x = _value((4, 8), "cuda")
    assert x.is_cuda and x.device.type == "cuda"
    assert "AutocastCUDA" in str(torch._C._dispatch_keys(x))
    chosen = {}
    for device in ("cuda", "cpu"):
        with _Ops() as ops:
            y = F.dropout(_value((4, 8), device), 0.5, training=True)
        assert type(y) is DeviceMeta and y.device.type == device
        chosen[device] = ops.names
    assert "native_dropout" in chosen["cuda"]
    assert "native_dropout" not in chosen["cpu"] and "bernoulli_" in chosen["cpu"]


def test_autocast_casts_a_value_reporting_the_cpu():
    a, b = _value((4, 8), "cpu"), _value((8, 8), "cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (a @ b).dtype == torch.bfloat16
        m = torch.empty(4, 8, device="meta")
        assert (m @ m.T).dtype == torch.float32  # a meta tensor is not cast


def test_views_share_their_bases_storage_identity():
    x = without_data(torch.randn(4, 8))
    views = [x[1:], x.t(), x.view(32), x.transpose(0, 1)[2]]
    assert {joint._storage_ptr(v) for v in views} == {joint._storage_ptr(x)}
    assert joint._storage_ptr(x.clone()) != joint._storage_ptr(x)
    assert x[1:].untyped_storage().nbytes() == 4 * 8 * 4


@pytest.mark.parametrize("read", [lambda t: t.sum().item(), lambda t: t.nonzero(),
                                  lambda t: bool(t.sum()), lambda t: torch.equal(t, t)])
def test_reading_a_value_raises(read):
    with pytest.raises(NeedsRealValues):
        read(without_data(torch.randn(3)))


def test_attentions_kernel_choice_is_the_real_devices():
    """`_fused_sdp_choice` answers as for the real device (CPU: flash), not as for meta (math)."""
    q = torch.randn(2, 2, 8, 16)
    real = aten._fused_sdp_choice.default(q, q, q)
    assert real != aten._fused_sdp_choice.default(*[torch.empty_like(q, device="meta")] * 3)
    assert aten._fused_sdp_choice.default(*[without_data(q)] * 3) == real


def test_tensors_made_on_a_traced_device_hold_no_data():
    """Under MetaCompute a factory for a traced device makes a DeviceMeta, a real tensor that
    meets one is computed as its metadata, and writing a real tensor from one raises."""
    x = without_data(torch.randn(4, 8))
    real = torch.randn(4, 8)
    with MetaCompute([torch.device("cpu")]):
        made = [torch.arange(4), torch.zeros(2, 3, device="cpu"), torch.full((3,), 2.0)]
        mixed = x + real
        on_meta = torch.empty(2, device="meta")  # not a traced device: as it is
        with pytest.raises(NeedsRealValues):
            real.add_(x)
    assert all(type(t) is DeviceMeta and t.device.type == "cpu" for t in (*made, mixed))
    assert type(on_meta) is torch.Tensor and on_meta.is_meta
    assert x.add_(1.0) is x  # in place: the same tensor


def test_writing_a_real_tensor_it_does_not_return_raises():
    """Batch norm writes its running statistics and returns other tensors: real statistics would
    keep their values while the trace went on as if updated."""
    x = without_data(torch.randn(4, 3, 5))
    weight, bias = without_data(torch.ones(3)), without_data(torch.zeros(3))
    mean, var = torch.zeros(3), torch.ones(3)
    with MetaCompute([torch.device("cpu")]), pytest.raises(NeedsRealValues):
        aten._native_batch_norm_legit.default(x, weight, bias, mean, var, True, 0.1, 1e-5)
    traced = [without_data(t) for t in (mean, var)]
    with MetaCompute([torch.device("cpu")]):
        out = aten._native_batch_norm_legit.default(x, weight, bias, *traced, True, 0.1, 1e-5)
    assert all(type(t) is DeviceMeta for t in out)


def test_changing_a_values_sizes_in_place_raises():
    with pytest.raises(NeedsRealValues):
        without_data(torch.randn(4, 8)).t_()
