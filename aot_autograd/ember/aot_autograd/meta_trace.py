"""Tracing on metadata: the program runs on values without data that report the inputs'
devices (device_meta.py), so a trace holds no activations and records what a trace on real
values records.

A trace on real values computes the whole forward and backward once more, decomposed (so with
more temporaries than eager): on a GPU every training trace did, and GPT-2's on an H200 peaked at
4833 MiB, above torch's whole first compiled step (3740 MiB). On values without data every op
computes only sizes, strides and dtypes, which is all the graph records; as they report the real
device, what torch decides by device is decided as on real values: autocast's casts, kernel
choices in composite ops (cuDNN batch norm, fused dropout, attention's kernel), primtorch's
per-device dtypes (norm statistics of float16/bfloat16), random seeds (one per device:
`plan.rng_devices`). A trace on plain meta tensors (before) decided all of these as for "meta"
and could only be used on the CPU without them. Measured on the CPU, GPT-2-style, 4 layers,
d=256, 8 x 256 tokens, 2 threads (first trace in the process / a second one):
- bfloat16 autocast, dropout 0.1: 19.2 / 20.0 s and 866 MiB peak RSS on real values -> 2.2 /
  1.1 s and 103 MiB (the graph's own objects); a bfloat16 model 7.1 / 4.5 s -> 1.5 / 0.5 s;
- float32, traced on plain meta tensors before: 1.35 / 0.38 s -> 1.54 / 0.41 s;
- the first bfloat16-autocast training step (ember.compile, attention by sdpa), peak RSS growth
  347 -> 155 MiB (eager's first step: 157 MiB); with dropout 363 -> 162 MiB.

The trace runs on real values (parameters read in place: joint.lendable) without trying, for an
input that is a tensor subclass (it may compute metadata from data), an input on the meta device
or no tensor input, and under value checks (`EMBER_PRIMTORCH_CHECK=1` compares decompositions
with eager on values); and after the trace without data failed in any way (logged at debug),
as for an op without a meta kernel, one that changes a value's sizes in place, a value read (the
tracer refuses `.item()` and data-dependent sizes in either trace), or a constant of the graph
made without data. A program whose first trace fails runs twice while tracing (its Python side
effects happen twice). Attention's constant masks, whose values choose its kernel, are computed
again from their recorded prims (primtorch attention._constant_value).
`config.metadata_trace` (env `EMBER_AOT_METADATA_TRACE=0`) turns traces without data off.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Callable

import torch

from ember.primtorch import LentInputWritten

from .device_meta import MetaCompute, NeedsRealValues, holds_no_data, without_data
from .joint import Traced, trace

log = logging.getLogger("ember.aot_autograd")


@dataclasses.dataclass
class MetaTraceConfig:
    """Whether traces run on values without data where that records the same graph."""

    metadata_trace: bool = os.environ.get("EMBER_AOT_METADATA_TRACE", "1") != "0"


config = MetaTraceConfig()


def trace_program(flat_fn: Callable, inputs: list, symbolic=None, overwritten=()) -> Traced:
    """`joint.trace` on values without data that report the inputs' devices, where that
    records the same graph; else (or when that trace fails) on real values."""
    devices = _traced_devices(inputs)
    if devices and _allowed():
        try:
            with MetaCompute(devices):
                traced = trace(flat_fn, inputs, symbolic, clone=without_data,
                               overwritten=overwritten)  # fmt: skip
            _check_recordable(traced)
            return traced
        except Exception as e:  # noqa: BLE001  (any failure: the real trace decides)
            log.debug("aot_autograd: tracing on real values: %s: %s", type(e).__name__, e)
    try:  # the parameters read where they are, not copied (joint.lendable)
        return trace(flat_fn, inputs, symbolic, overwritten=overwritten, lend=True)
    except LentInputWritten as e:
        log.debug("aot_autograd: tracing on copies of the parameters: %s", e)
    return trace(flat_fn, inputs, symbolic, overwritten=overwritten)


def _allowed() -> bool:
    from ember.primtorch.config import config as primtorch_config

    return config.metadata_trace and not primtorch_config.check


def _traced_devices(inputs: list) -> set:
    """The devices of the tensor inputs, when every one is a plain tensor with data (else
    none: a subclass may compute its metadata from its data, a meta tensor has none to hold)."""
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    if any(type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter or t.is_meta
           for t in tensors):  # fmt: skip
        return set()
    return {t.device for t in tensors}


def _check_recordable(traced: Traced) -> None:
    """A graph input made without data (a constant the program closes over, made in the trace)
    would have no value to run with."""
    if any(holds_no_data(t) for t in (*traced.plan.constants, *traced.gm.state_dict().values())):
        raise NeedsRealValues("a constant of the graph was made without data")
