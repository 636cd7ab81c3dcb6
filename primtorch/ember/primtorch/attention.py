"""Which kernel a traced `scaled_dot_product_attention` with a mask runs on CUDA.

`F.scaled_dot_product_attention` picks its kernel at dispatch, inside the ATen op, so the tracer
records whatever that choice decomposes to. With an attention mask torch may pick cuDNN (which the
tracer turns off: it has no extern of ours) or the math path, and the math path materializes the
(L, S) scores of every head in float32: two float32 batched matmuls and a softmax over
B*H*L*S elements where one fused kernel would do. While tracing, `AttentionChoice` sends such
inference calls to the memory-efficient kernel (`_scaled_dot_product_efficient_attention`, an
extern) whenever it takes them, and leaves every other call to torch.

Before that, an inference call that torch itself would run on cuDNN's fused attention (asked with
cuDNN enabled as the user had it: the tracer turns it off for torch's own dispatch, whose cuDNN
call returns outputs a training graph would need and we have no extern for) is recorded as
`extern.sdpa_cudnn` (`cudnn_attention`), so compiled inference runs the kernel that eager (and
torch's own compiler) runs. `config.cudnn_attention = False` turns that off.

In training, a mask that is a constant of the program and allows everything or is exactly causal
is dropped (`training_without_constant_mask`): torch then runs flash attention, forward and
backward, where with the mask it could only run the memory-efficient kernel. And a backward
without dropout gets empty random-number state of its own on the GPU
(`without_unread_rng_state`), so it reads no host tensor and can replay from a CUDA graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .prims.extern import rng_state_of

aten = torch.ops.aten

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class AttentionChoice(TorchFunctionMode):
    """A torch-function mode, active while tracing, for CUDA attention (see module doc).
    `cudnn_enabled`: torch.backends.cuda.cudnn_sdp_enabled() as the user had it; `tracer`: the
    Tracer recording (to tell a mask that is a constant of the program), or None."""

    def __init__(self, cudnn_enabled: bool = False, tracer=None):
        super().__init__()
        self.cudnn_enabled = cudnn_enabled
        self.tracer = tracer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            out = cudnn_attention(*args, **kwargs, cudnn_enabled=self.cudnn_enabled,
                                  tracer=self.tracer)  # fmt: skip
            if out is None:
                out = efficient_attention(*args, **kwargs)
            if out is None and self.tracer is not None and torch.is_grad_enabled():
                out = training_without_constant_mask(func, self.tracer, *args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


def _static(t) -> bool:
    return isinstance(t, torch.Tensor) and all(type(s) is int for s in t.shape)


def _hint(n) -> int:
    return n if isinstance(n, int) else int(n.node.hint)


def torch_choice(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, *,
                 cudnn=None):  # fmt: skip
    """The SDPBackend torch would run this attention on, asked with plain tensors of the same
    (hint) sizes, strides and dtypes, autocast's dtype where it applies (the choice is made in
    C++, out of the tracer's sight). cudnn: whether torch may choose cuDNN (None: as set now)."""
    from torch.utils._python_dispatch import _disable_current_modes

    amp = torch.is_autocast_enabled(query.device.type)
    dtype = torch.get_autocast_dtype(query.device.type) if amp else None

    def plain(t):
        if t is None:
            return None
        d = dtype if dtype is not None and t.is_floating_point() else t.dtype
        return torch.empty_strided([_hint(n) for n in t.shape], [_hint(n) for n in t.stride()],
                                   dtype=d, device=t.device)  # fmt: skip

    was = torch.backends.cuda.cudnn_sdp_enabled()
    with _disable_current_modes():
        args = [plain(t) for t in (query, key, value, attn_mask)]
        try:
            if cudnn is not None:
                torch.backends.cuda.enable_cudnn_sdp(cudnn)
            choice = torch._fused_sdp_choice(*args, dropout_p, is_causal, scale=scale,
                                             enable_gqa=enable_gqa)  # fmt: skip
        finally:
            torch.backends.cuda.enable_cudnn_sdp(was)
    return torch.nn.attention.SDPBackend(choice)


def recorded(t: torch.Tensor) -> torch.Tensor:
    """The tensor the tracer and autograd see under functionalize's wrapper (the wrapper itself
    reads requires_grad=False, and the tracer does not know it)."""
    if torch._is_functional_tensor(t):
        torch._sync(t)
        return torch._from_functional_tensor(t)
    return t


def autocast_input(t, dtype):
    """`t` as autocast hands it to attention: floating tensors in `dtype` (None: as they are)."""
    return t.to(dtype) if dtype is not None and t.is_floating_point() else t


def efficient_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                        scale=None, enable_gqa=False):  # fmt: skip
    """The memory-efficient kernel's output for a masked CUDA attention it supports, else None
    (torch then makes its own choice)."""
    q, k, v = query, key, value
    if torch.is_grad_enabled():
        # Training is left to torch's choice: the kernel's backward, traced through functionalize,
        # failed its log-sum-exp alignment check on an H100 (to be looked into).
        return None
    if attn_mask is None or is_causal or enable_gqa:
        return None  # no mask: torch picks flash attention, which is an extern already
    if not all(_static(t) for t in (q, k, v, attn_mask)):
        return None  # symbolic sizes: left to torch
    if not (q.is_cuda and q.dim() == 4 and k.dim() == 4 and v.dim() == 4):
        return None
    if q.is_nested or q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3]:
        return None
    amp = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
    if amp is not None and amp not in (torch.float16, torch.bfloat16):
        return None
    if not (q.dtype in _DTYPES and q.dtype == k.dtype == v.dtype) and amp is None:
        return None
    dtype = amp or q.dtype
    if q.shape[-1] != k.shape[-1] or q.shape[-1] % 8 or v.shape[-1] % 8:
        return None
    batch, heads, length = q.shape[:3]
    source = k.shape[2]
    if attn_mask.dim() > 4 or attn_mask.shape[-1] != source:
        return None
    try:
        torch.broadcast_shapes(attn_mask.shape, (batch, heads, length, source))
    except RuntimeError:
        return None
    q, k, v = (autocast_input(t, amp) for t in (q, k, v))
    bias = efficient_bias(attn_mask, q, dtype)
    if bias is None:
        return None
    try:
        out = aten._scaled_dot_product_efficient_attention(
            q, k, v, bias, False, dropout_p, False, scale=scale
        )
    except RuntimeError:
        return None  # the kernel refused these arguments: torch chooses
    return out[0]


def efficient_bias(attn_mask, query, dtype):
    """`attn_mask` (bool or additive, at most 4-d) as the memory-efficient kernel's additive bias
    in `dtype`: rows padded to a multiple of 16 elements and viewed back (the kernel reads them
    so), broadcast to query's (B, H, L) where its size is 1. Sizes may be ints or SymInts (a
    mask's own length is then another symbol, equal at run time, which the kernel checks).
    None for a mask the kernel does not take."""
    if attn_mask.dim() > 4:
        return None
    if attn_mask.dtype == torch.bool:
        bias = torch.zeros(attn_mask.shape, dtype=dtype, device=query.device)
        bias = bias.masked_fill(attn_mask.logical_not(), float("-inf"))
    elif attn_mask.is_floating_point():
        bias = attn_mask.to(dtype)
    else:
        return None
    source = bias.shape[-1]
    padded = (source + 15) // 16 * 16
    if not (isinstance(padded, int) and padded == source):
        bias = F.pad(bias, (0, padded - source))[..., :source]
    lead = [1] * (4 - bias.dim()) + list(bias.shape[:-1])
    return bias.expand(*(q if n == 1 else n for q, n in zip(query.shape[:3], lead)), source)


# --- a mask that is a constant of the program ----------------------------------------------------

_EFFICIENT_ARGS = ("query", "key", "value", "attn_bias", "compute_log_sumexp", "dropout_p",
                   "is_causal")  # fmt: skip
_BLOCKED = -1e4  # an additive bias at or below this is a masked-out position (-inf, finfo.min)


def _depends_on_inputs(node) -> bool:
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder":
            return True
        stack.extend(n.all_input_nodes)
    return False


def _kind_of_constant(tracer, mask, length, source):
    """`_constant_mask_kind` of a constant of the traced program, read with every mode off: no
    mode records, or makes values without data of, what the reading computes."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return _constant_mask_kind(_constant_value(tracer, mask), length, source)


def _constant_mask_kind(bias, length, source):
    """"none" when the bias (additive, or a boolean mask) adds nothing, "causal" when it is the
    causal mask, else None."""
    if bias.dtype == torch.bool:
        allowed, blocked = bias, ~bias
    else:
        allowed, blocked = bias == 0, bias <= _BLOCKED
    if bool(allowed.all()):
        return "none"
    if length != source or not bool((allowed | blocked).all()):
        return None
    causal = torch.ones(length, source, dtype=torch.bool, device=bias.device).tril()
    return "causal" if bool((allowed == causal).all()) else None


def _a_constant(tracer, t) -> bool:
    """Whether `t` is a value the traced program computes from no input (sizes alone)."""
    return tracer.is_traced(t) and not _depends_on_inputs(tracer.node_of(t))


def _constant_value(tracer, t: torch.Tensor) -> torch.Tensor:
    """The values of `t`, a constant of the traced program (`_a_constant`; called with every
    mode off). A trace on values without data (meta storage: aot_autograd's metadata trace)
    computes them again here from the prims it recorded for `t`, on real tensors: a mask of
    L*S elements, where the whole trace would otherwise run again on real values to read it."""
    if t.untyped_storage().device.type != "meta":
        return t
    from torch.fx.node import map_arg

    from .prims import core

    wanted, stack = set(), [tracer.node_of(t)]
    while stack:
        n = stack.pop()
        if n not in wanted:
            wanted.add(n)
            stack.extend(n.all_input_nodes)
    values = {}
    core.push_recorder(None)  # prims run their references, unrecorded
    try:
        for n in tracer.graph.nodes:
            if n not in wanted:
                continue
            if n.op == "get_attr":
                values[n] = tracer.constants[n.target]
                continue
            args, kwargs = map_arg((n.args, n.kwargs), values.__getitem__)
            values[n] = n.target(*args, **kwargs)
    finally:
        core.pop_recorder(None)
    return values[tracer.node_of(t)]


_CPU_FLASH_ARGS = ("query", "key", "value", "dropout_p", "is_causal")


def cpu_flash_arguments(args, kwargs) -> dict:
    """The arguments of `_scaled_dot_product_flash_attention_for_cpu`, by name."""
    return dict(zip(_CPU_FLASH_ARGS, args), **kwargs)


def constant_cpu_mask_kind(tracer, bound: dict):
    """As `constant_mask_kind`, for the CPU flash kernel's `attn_mask` (its arguments `bound`
    by name)."""
    q, k, mask = bound["query"], bound["key"], bound.get("attn_mask")
    if mask is None or bound.get("is_causal") or bound.get("dropout_p", 0.0) != 0.0:
        return None
    if tracer.shape_env is not None or mask.dim() < 2 or not _a_constant(tracer, mask):
        return None
    return _kind_of_constant(tracer, mask, q.shape[2], k.shape[2])


def constant_mask_kind(tracer, args, kwargs):
    """For `_scaled_dot_product_efficient_attention` in inference (called by the tracer with its
    mode off): "none" when the bias is computed from no input of the program (a mask built from
    the sizes alone, as transformers builds one when no attention mask is passed) and is all
    zeros, "causal" when such a bias is exactly the causal mask; the tracer then records the
    flash kernel (no bias, or is_causal) instead. None otherwise."""
    bound = dict(zip(_EFFICIENT_ARGS, args), **kwargs)
    q, k, v, bias = (bound.get(n) for n in ("query", "key", "value", "attn_bias"))
    if bias is None or bound.get("compute_log_sumexp") or bound.get("is_causal"):
        return None
    if bound.get("dropout_p", 0.0) != 0.0 or tracer.shape_env is not None:
        return None
    if q.dtype not in (torch.float16, torch.bfloat16) or q.shape[-1] > 256 or q.shape[-1] % 8:
        return None
    if v.shape[-1] != q.shape[-1] or not _a_constant(tracer, bias):
        return None
    return _kind_of_constant(tracer, bias, q.shape[2], k.shape[2])


def training_without_constant_mask(func, tracer, query, key, value, attn_mask=None,
                                   dropout_p=0.0, is_causal=False, scale=None,
                                   enable_gqa=False):  # fmt: skip
    """A training call (`func`, scaled_dot_product_attention, autograd intact) whose mask is a
    constant of the program that allows everything or is exactly causal, made without the mask
    (is_causal for the latter), else None. With a mask torch can only run the memory-efficient
    kernel (3.3 ms of a GPT-2 step on an H100 against 1.4 ms for a causal kernel, which skips the
    masked blocks); without one it runs flash attention, whose forward and backward are externs.
    The values are the same: such a mask adds 0 where it allows and excludes where it masks,
    and a causal mask never excludes a whole row."""
    if attn_mask is None or is_causal or not query.is_cuda:
        return None
    kind = _constant_kind_of(tracer, attn_mask, query, key)
    if kind is None:
        return None
    return func(query, key, value, attn_mask=None, dropout_p=dropout_p,
                is_causal=kind == "causal", scale=scale, enable_gqa=enable_gqa)  # fmt: skip


def without_unread_rng_state(func, args, empty):
    """`args` of an attention backward `func` with its philox seed and offset replaced by
    `empty(device)` where dropout is off, else `args` unchanged. Which arguments those are is
    the extern's declaration (prims.extern.RngState). The forward's seed and offset are CPU
    tensors for the memory-efficient kernel; a backward without dropout never reads them, so it
    gets empty ones of its own on the GPU: they are then not saved, and the backward reads no
    host tensor (which kept it from a CUDA graph's replay)."""
    state = rng_state_of(func)
    if state is None or not state.args or len(args) <= max(state.dropout, *state.args):
        return args
    if not state.without_dropout(args):
        return args
    args = list(args)
    device = args[1].device  # the query
    for i in state.args:
        args[i] = empty(device)
    return tuple(args)


# --- cuDNN's fused attention, in inference -------------------------------------------------------

_CUDNN_DTYPES = (torch.float16, torch.bfloat16)
# torch fills a boolean mask's False with this finite value for cuDNN, not -inf (convert_boolean_
# attn_mask_cudnn in ATen's attention.cpp: some cuDNN versions mishandle -inf in the bias); the
# same value here gives what eager gives. exp() of it is 0 in every row that allows some key.
CUDNN_MASKED = -65504.0


def _amp_dtype(device_type: str):
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def cudnn_takes_mask(attn_mask, query, key) -> bool:
    """Whether cuDNN's attention takes `attn_mask` as torch hands it over: bool or floating,
    2-, 3- or 4-d, (1 or B, 1 or H, 1 or L, S); ATen expands it to (B, H or 1, L, S) itself, so
    a 3-d mask's first dim must be 1."""
    if not (attn_mask.dtype == torch.bool or attn_mask.is_floating_point()):
        return False
    if attn_mask.dim() not in (2, 3, 4) or attn_mask.shape[-1] != key.shape[2]:
        return False
    batch, heads, length = query.shape[:3]
    lead = [1] * (4 - attn_mask.dim()) + list(attn_mask.shape[:-1])
    if attn_mask.dim() == 3 and lead[1] != 1:
        return False
    return all(n in (1, want) for n, want in zip(lead, (batch, heads, length)))


def choose_cudnn(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                 enable_gqa=False, *, cudnn_enabled: bool, ask=None) -> bool:  # fmt: skip
    """Whether an attention call is recorded as extern.sdpa_cudnn: in inference, with static
    sizes inside cuDNN's supported set (fp16/bf16, 4-d, equal head dims that are multiples of
    8, no dropout, no GQA), exactly when torch itself would run it on cuDNN, asked through
    `ask` (default torch_choice) with cuDNN enabled as the user had it (`cudnn_enabled`)."""
    from .config import config

    if not (config.cudnn_attention and cudnn_enabled) or torch.is_grad_enabled():
        return False  # training keeps torch's choice: sdpa_cudnn has no backward
    if dropout_p != 0.0 or enable_gqa:
        return False
    tensors = (query, key, value) + (() if attn_mask is None else (attn_mask,))
    if not all(_static(t) for t in tensors) or any(t.is_nested for t in tensors):
        return False
    if not (query.dim() == key.dim() == value.dim() == 4):
        return False
    amp = _amp_dtype(query.device.type)
    if amp is None and not query.dtype == key.dtype == value.dtype:
        return False
    if (amp or query.dtype) not in _CUDNN_DTYPES:
        return False
    head = query.shape[-1]
    # torch's own limit is 128, or 256 on sm90 with a recent cuDNN: its answer below decides
    if key.shape[-1] != head or value.shape[-1] != head or head % 8 or head > 256:
        return False
    if query.shape[:2] != key.shape[:2] or key.shape[:3] != value.shape[:3]:
        return False
    if attn_mask is not None and not cudnn_takes_mask(attn_mask, query, key):
        return False
    ask = ask or torch_choice
    choice = ask(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                 cudnn=True)  # fmt: skip
    return choice == torch.nn.attention.SDPBackend.CUDNN_ATTENTION


def cudnn_bias(attn_mask, dtype):
    """`attn_mask` as cuDNN's additive bias in `dtype`, 4-d: a boolean mask becomes 0 where it
    allows and CUDNN_MASKED where it masks (as torch converts it for cuDNN); rows are padded to a
    multiple of 16 elements and viewed back (16-byte aligned row strides; the lowering keeps
    them so: ARG_STRIDES). Broadcast dims stay size 1: ATen expands them as cuDNN wants."""
    if attn_mask.dtype == torch.bool:
        bias = torch.zeros(attn_mask.shape, dtype=dtype, device=attn_mask.device)
        bias = bias.masked_fill(attn_mask.logical_not(), CUDNN_MASKED)
    else:
        bias = attn_mask.to(dtype)
    source = bias.shape[-1]
    padded = (source + 15) // 16 * 16
    if padded != source:
        bias = F.pad(bias, (0, padded - source))[..., :source]
    return bias.reshape(*([1] * (4 - bias.dim())), *bias.shape)


def _constant_kind_of(tracer, attn_mask, query, key):
    """attention's constant-mask verdict ("none", "causal" or None) for a mask the traced
    program computes from no input (see constant_mask_kind)."""
    mask = recorded(attn_mask)
    if tracer.shape_env is not None or mask.dim() < 2 or not _a_constant(tracer, mask):
        return None
    return _kind_of_constant(tracer, mask, query.shape[2], key.shape[2])


def cudnn_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None, enable_gqa=False, *, cudnn_enabled=False, tracer=None,
                    ask=None):  # fmt: skip
    """extern.sdpa_cudnn's output for an inference attention torch would run on cuDNN
    (choose_cudnn), else None. A mask that is a constant of the program allowing everything, or
    exactly causal, is dropped first (is_causal for the latter), as the flash path does: the
    kernel then reads no bias and skips the masked blocks."""
    if attn_mask is not None and tracer is not None and not is_causal and dropout_p == 0.0:
        kind = _constant_kind_of(tracer, attn_mask, query, key)
        if kind is not None:
            attn_mask, is_causal = None, kind == "causal"
    if not choose_cudnn(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                        cudnn_enabled=cudnn_enabled, ask=ask):  # fmt: skip
        return None
    amp = _amp_dtype(query.device.type)
    q, k, v = (autocast_input(t, amp) for t in (query, key, value))
    bias = None if attn_mask is None else cudnn_bias(attn_mask, q.dtype)
    try:
        # the ATen op, not the extern: under aot_autograd these are functionalize's wrappers,
        # and the tracer below them records this inference form as extern.sdpa_cudnn
        with torch.autocast(query.device.type, enabled=False):
            return aten._scaled_dot_product_cudnn_attention(
                q, k, v, bias, False, 0.0, is_causal, False, scale=scale
            )[0]
    except RuntimeError:
        return None  # the kernel refused these arguments: the other kernels' path decides


_CUDNN_ARGS = ("query", "key", "value", "attn_bias", "compute_log_sumexp", "dropout_p",
               "is_causal", "return_debug_mask")  # fmt: skip


def cudnn_inference_arguments(args, kwargs):
    """(args, kwargs) of extern.sdpa_cudnn for a `_scaled_dot_product_cudnn_attention` call in
    its inference form (no log-sum-exp, dropout or debug mask: what cudnn_attention calls), else
    None (a training call: the extern has no backward)."""
    bound = dict(zip(_CUDNN_ARGS, args), **kwargs)
    if bound.get("compute_log_sumexp") or bound.get("return_debug_mask"):
        return None
    if bound.get("dropout_p", 0.0) != 0.0:
        return None
    extern_args = tuple(bound[n] for n in ("query", "key", "value", "attn_bias"))
    return (*extern_args, bool(bound.get("is_causal", False))), {"scale": bound.get("scale")}
