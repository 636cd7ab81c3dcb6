"""Extern ops: library kernels a backend calls rather than generates (see primtorch/README.md).

Each one mirrors an ATen op (same argument names and order), is registered as "extern.<name>"
with the tag "extern", and has a meta rule that gives the layout torch's kernel produces. The
tracer records one of these instead of decomposing when it meets an ATen op in `ATEN_TO_EXTERN`.
"""

from __future__ import annotations

import dataclasses
import itertools

import sympy
import torch

from ember.ir import TensorMeta, as_expr, sym
from ember.ir.symbols import FloorDiv

from .. import utils
from .core import Prim, prim

_EXTERN = ("extern",)
aten = torch.ops.aten

# ATen overload -> (extern op, adapter turning the ATen call's (args, kwargs) into the extern's).
ATEN_TO_EXTERN: dict = {}


@dataclasses.dataclass(frozen=True)
class RngState:
    """Which arguments and results of an extern are its random-number state (the philox seed and
    offset of its dropout), by position: `dropout` is where its dropout probability is, `args`
    the state it reads, `results` the state it returns. Without dropout the kernel neither draws
    nor reads that state, so a caller may hand it placeholders and ignore what it returns."""

    dropout: int
    args: tuple[int, ...] = ()
    results: tuple[int, ...] = ()

    def dropout_p(self, args, kwargs=None):
        """The call's dropout probability (a number, or whatever stands for it in `args`)."""
        if len(args) > self.dropout:
            return args[self.dropout]
        return (kwargs or {}).get("dropout_p", 0.0)

    def without_dropout(self, args, kwargs=None) -> bool:
        """Whether the call `args`, `kwargs` is one without dropout (its state unread, unused)."""
        p = self.dropout_p(args, kwargs)
        return isinstance(p, (int, float)) and float(p) == 0.0


# "extern.<name>" -> its RngState, for the externs that have one (read by the tracer, which
# gives an attention backward without dropout empty GPU scalars for the forward's CPU seed and
# offset, and by inductor's CUDA graphs, for which such host results are then not host work).
RNG_STATE: dict[str, RngState] = {}


def rng_state_of(target):
    """The RngState of an extern (the op or its name) or of the ATen overload it stands for (an
    extern takes its ATen op's arguments in the same order); None where there is none."""
    if isinstance(target, str):
        return RNG_STATE.get(target)
    if not isinstance(target, Prim):  # an ATen overload
        entry = ATEN_TO_EXTERN.get(target)
        if entry is None or entry[1] is not None:  # an adapter may move the arguments
            return None
        target = entry[0]
    return RNG_STATE.get(target.schema.name)


def _check_rng_state(p, rng_state: RngState):
    # the positions are checked against the signature once, here, rather than trusted by each
    # reader: a wrong one would drop the seed a dropout needs
    names = [a.name for a in p.schema.args]
    bad = [f"{i} (not an argument)" for i in (rng_state.dropout, *rng_state.args)
           if i >= len(names)]  # fmt: skip
    if not bad and names[rng_state.dropout] != "dropout_p":
        bad.append(f"{rng_state.dropout} ({names[rng_state.dropout]}, not dropout_p)")
    bad += [f"{i} ({names[i]}, not a philox argument)" for i in rng_state.args
            if i < len(names) and not names[i].startswith("philox_")]  # fmt: skip
    if bad:
        raise ValueError(f"{p.schema.name}: wrong random-number state positions: {bad}")


def _extern(name, signature, meta, aten_ops, ref=None, tags=(), adapt=None, doc="",
            traced_from_aten=True, rng_state=None):  # fmt: skip
    """Register extern.<name>, standing for `aten_ops` (the first one is its default reference).
    With traced_from_aten=False the tracer never records it for an ATen call (the extern is one
    narrower use of the op, recorded where that use is chosen). `rng_state`: its RngState."""
    first = aten_ops[0]
    p = prim(
        name,
        signature,
        meta=meta,
        ref=ref or (lambda *a, **k: first(*a, **k)),
        tags=_EXTERN + tuple(tags),
        namespace="extern",
        doc=doc or f"the ATen kernel {first}",
    )
    for op in aten_ops if traced_from_aten else ():
        ATEN_TO_EXTERN[op] = (p, adapt.get(op) if isinstance(adapt, dict) else adapt)
    if rng_state is not None:
        _check_rng_state(p, rng_state)
        RNG_STATE[p.schema.name] = rng_state
    return p


def _contiguous(dtype, sizes, device):
    return TensorMeta(dtype, sizes, utils.make_contiguous_strides_for(sizes), 0, device)


def _check_mm_dtypes(name, *ts):
    utils.check_same_dtype(*ts, name=f"extern.{name}")


# --- matrix multiplication -----------------------------------------------------------------------


def _mm_meta(self, mat2):
    _check_mm_dtypes("mm", self, mat2)
    if self.ndim != 2 or mat2.ndim != 2 or not utils.known_eq(self.sizes[1], mat2.sizes[0]):
        raise ValueError(f"extern.mm: cannot multiply {self.sizes} by {mat2.sizes}")
    return _contiguous(self.dtype, (self.sizes[0], mat2.sizes[1]), self.device)


def _bmm_meta(self, mat2):
    _check_mm_dtypes("bmm", self, mat2)
    ok = self.ndim == 3 and mat2.ndim == 3 and utils.known_eq(self.sizes[0], mat2.sizes[0])
    if not ok or not utils.known_eq(self.sizes[2], mat2.sizes[1]):
        raise ValueError(f"extern.bmm: cannot multiply {self.sizes} by {mat2.sizes}")
    return _contiguous(self.dtype, (self.sizes[0], self.sizes[1], mat2.sizes[2]), self.device)


def _addmm_meta(self, mat1, mat2, *, beta=1, alpha=1):
    out = _mm_meta(mat1, mat2)
    _check_mm_dtypes("addmm", self, mat1)
    utils.broadcast_shapes(self.sizes, out.sizes)
    return out


def _baddbmm_meta(self, batch1, batch2, *, beta=1, alpha=1):
    out = _bmm_meta(batch1, batch2)
    _check_mm_dtypes("baddbmm", self, batch1)
    utils.broadcast_shapes(self.sizes, out.sizes)
    return out


mm = _extern("mm", "(Tensor self, Tensor mat2) -> Tensor", _mm_meta, [aten.mm.default])
bmm = _extern("bmm", "(Tensor self, Tensor mat2) -> Tensor", _bmm_meta, [aten.bmm.default])
addmm = _extern(
    "addmm",
    "(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor",
    _addmm_meta,
    [aten.addmm.default],
)
baddbmm = _extern(
    "baddbmm",
    "(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1) -> Tensor",
    _baddbmm_meta,
    [aten.baddbmm.default],
)

# --- convolution ---------------------------------------------------------------------------------


def conv_layout(sizes, input, weight) -> tuple:
    """Strides of a convolution's output (or grad) of `sizes`: torch's CPU and cuDNN kernels
    produce channels-last when the input or the weight (TensorMetas) suggests it."""
    fmt = torch.contiguous_format
    for t in (input, weight):
        f = utils.suggest_memory_format(t.sizes, t.strides)
        if f is not torch.contiguous_format:
            fmt = f
    if len(sizes) not in (4, 5):
        fmt = torch.contiguous_format
    return utils.memory_format_strides(sizes, fmt)


def _conv_out_sizes(input, weight, stride, padding, dilation, transposed, output_padding, groups):
    spatial = input.ndim - 2
    stride, padding, dilation = (_expand(v, spatial) for v in (stride, padding, dilation))
    output_padding = _expand(output_padding, spatial)
    sizes = [input.sizes[0]]
    sizes.append(weight.sizes[1] * groups if transposed else weight.sizes[0])
    for d in range(spatial):
        size, k = input.sizes[d + 2], weight.sizes[d + 2]
        span = as_expr(dilation[d]) * (k - 1)
        if transposed:
            out = (size - 1) * stride[d] - 2 * padding[d] + span + output_padding[d] + 1
        else:
            out = FloorDiv(size + 2 * padding[d] - span - 1, as_expr(stride[d])) + 1
        sizes.append(sympy.expand(out))
    return tuple(sizes)


def _expand(v, n):
    v = list(v)
    return v * n if len(v) == 1 else v


def _convolution_meta(
    input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
):
    _check_mm_dtypes("convolution", input, weight)
    sizes = _conv_out_sizes(
        input, weight, stride, padding, dilation, transposed, output_padding, groups
    )
    return TensorMeta(input.dtype, sizes, conv_layout(sizes, input, weight), 0, input.device)


convolution = _extern(
    "convolution",
    "(Tensor input, Tensor weight, Optional[Tensor] bias, int[] stride, int[] padding, "
    "int[] dilation, bool transposed, int[] output_padding, int groups) -> Tensor",
    _convolution_meta,
    [aten.convolution.default],
)


def _convolution_backward_meta(
    grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    output_padding, groups, output_mask,
):  # fmt: skip
    def like(t):
        return TensorMeta(t.dtype, t.sizes, conv_layout(t.sizes, input, weight), 0, t.device)

    grad_bias = _contiguous(grad_output.dtype, (grad_output.sizes[1],), grad_output.device)
    outs = (like(input), like(weight), grad_bias)
    return tuple(out if wanted else None for out, wanted in zip(outs, output_mask))


convolution_backward = _extern(
    "convolution_backward",
    "(Tensor grad_output, Tensor input, Tensor weight, Optional[int[]] bias_sizes, int[] stride, "
    "int[] padding, int[] dilation, bool transposed, int[] output_padding, int groups, "
    "bool[] output_mask) -> (Tensor, Tensor, Tensor)",
    _convolution_backward_meta,
    [aten.convolution_backward.default],
    doc="grads of input, weight, bias (None where output_mask is False)",
)

# --- scaled dot-product attention ----------------------------------------------------------------


def _blhe(sizes):
    # (B, H, L, E) laid out as (B, L, H, E): how the attention kernels store outputs and grads.
    return utils.strides_from_perm(sizes, [3, 1, 2, 0])


# Arguments whose layout an extern kernel assumes without checking it, by extern name and
# argument position: a function of the argument's sizes and strides giving the strides it must
# have. A lowering copies such an argument into that layout when it arrives in another one.
ARG_STRIDES: dict[str, dict[int, object]] = {}


def _round_up(n, multiple: int):
    """`n` rounded up to a multiple of `multiple`, as an expression the IR serialises."""
    return FloorDiv(sympy.sympify(n) + multiple - 1, multiple) * multiple


def _aligned_bias(sizes, strides):
    """The memory-efficient kernels read attn_bias rows at 16-element alignment (eager pads the
    bias's last dim to a multiple of 16 and slices it back): keep an aligned bias as it is, else
    lay it out in rows of that padded length (a sequence of 77 tokens failed the kernel's check)."""
    if strides is not None and strides[-1] == 1 and all(
        (sympy.sympify(st) / 16).is_integer for st in strides[:-1] if st != 0
    ):
        return strides  # static, or symbolic and a multiple of 16 for every size (16*FloorDiv)
    *lead, last = sizes
    return utils.make_contiguous_strides_for((*lead, _round_up(last, 16)))


def _check_qkv(name, query, key, value):
    utils.check_same_dtype(query, key, value, name=f"extern.{name}")
    if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
        raise ValueError(f"extern.{name}: query, key and value must be 4-d (B, H, L, E)")


def _like_query(query, value):
    # Flash kernels allocate the output like the query (same layout) when head sizes agree.
    out_sizes = query.sizes[:3] + (value.sizes[3],)
    if not utils.known_eq(value.sizes[3], query.sizes[3]):
        return utils.make_contiguous_strides_for(out_sizes)
    return utils.preserve_format_strides(query.sizes, query.strides)


def _sdpa_cpu_meta(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None,
                   scale=None):  # fmt: skip
    _check_qkv("sdpa_flash_cpu", query, key, value)
    b, h, lq = query.sizes[:3]
    out_sizes = (b, h, lq, value.sizes[3])
    out = TensorMeta(query.dtype, out_sizes, _like_query(query, value), 0, query.device)
    lse = TensorMeta(torch.float32, (b, h, lq), utils.strides_from_perm((b, h, lq), [1, 2, 0]),
                     0, query.device)  # fmt: skip
    return out, lse


def _sdpa_grads(query, key, value):
    return tuple(TensorMeta(t.dtype, t.sizes, _blhe(t.sizes), 0, t.device)
                 for t in (query, key, value))  # fmt: skip


def _sdpa_cpu_backward_meta(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *,
                            attn_mask=None, scale=None):  # fmt: skip
    _check_qkv("sdpa_flash_cpu_backward", query, key, value)
    return _sdpa_grads(query, key, value)


sdpa_flash_cpu = _extern(
    "sdpa_flash_cpu",
    "(Tensor query, Tensor key, Tensor value, float dropout_p=0.0, bool is_causal=False, *, "
    "Optional[Tensor] attn_mask=None, Optional[float] scale=None) -> (Tensor, Tensor)",
    _sdpa_cpu_meta,
    [aten._scaled_dot_product_flash_attention_for_cpu.default],
    doc="(output, logsumexp) of flash attention on CPU",
)
sdpa_flash_cpu_backward = _extern(
    "sdpa_flash_cpu_backward",
    "(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out, Tensor logsumexp, "
    "float dropout_p, bool is_causal, *, Optional[Tensor] attn_mask=None, "
    "Optional[float] scale=None) -> (Tensor, Tensor, Tensor)",
    _sdpa_cpu_backward_meta,
    [aten._scaled_dot_product_flash_attention_for_cpu_backward.default],
)


def _sdpa_flash_meta(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False,
                     *, scale=None):  # fmt: skip
    _check_qkv("sdpa_flash", query, key, value)
    b, h, lq, _ = query.sizes
    lk = key.sizes[2]
    out_sizes = (b, h, lq, value.sizes[3])
    out = TensorMeta(query.dtype, out_sizes, _like_query(query, value), 0, query.device)
    lse = _contiguous(torch.float32, (b, h, lq), query.device)
    rng = _contiguous(torch.uint64, (2,), query.device)
    unused = _contiguous(torch.uint64, (), query.device)
    mask_sizes = (b, h, lq, lk) if return_debug_mask else (0,)
    debug = _contiguous(query.dtype, mask_sizes, query.device)
    return out, lse, None, None, lq, lk, rng, unused, debug


sdpa_flash = _extern(
    "sdpa_flash",
    "(Tensor query, Tensor key, Tensor value, float dropout_p=0.0, bool is_causal=False, "
    "bool return_debug_mask=False, *, Optional[float] scale=None) -> (Tensor, Tensor, "
    "Optional[Tensor], Optional[Tensor], int, int, Tensor, Tensor, Tensor)",
    _sdpa_flash_meta,
    [aten._scaled_dot_product_flash_attention.default],
    doc="CUDA flash attention: (out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, rng_state, "
    "unused, debug_attn_mask)",
    rng_state=RngState(dropout=3, results=(6, 7)),
)


def _sdpa_flash_backward_meta(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k,
                              max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *,
                              scale=None):  # fmt: skip
    _check_qkv("sdpa_flash_backward", query, key, value)
    # The CUDA flash kernel writes each grad in its input's layout.
    return tuple(TensorMeta(t.dtype, t.sizes, utils.preserve_format_strides(t.sizes, t.strides), 0,
                            t.device) for t in (query, key, value))  # fmt: skip


sdpa_flash_backward = _extern(
    "sdpa_flash_backward",
    "(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out, Tensor logsumexp, "
    "Optional[Tensor] cum_seq_q, Optional[Tensor] cum_seq_k, int max_q, int max_k, "
    "float dropout_p, bool is_causal, Tensor philox_seed, Tensor philox_offset, *, "
    "Optional[float] scale=None) -> (Tensor, Tensor, Tensor)",
    _sdpa_flash_backward_meta,
    [aten._scaled_dot_product_flash_attention_backward.default],
    rng_state=RngState(dropout=10, args=(12, 13)),
)


def _sdpa_efficient_meta(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0,
                         is_causal=False, *, scale=None):  # fmt: skip
    _check_qkv("sdpa_efficient", query, key, value)
    b, h, lq, _ = query.sizes
    out_sizes = (b, h, lq, value.sizes[3])
    out = TensorMeta(query.dtype, out_sizes, _blhe(out_sizes), 0, query.device)
    # The kernel pads the logsumexp length to a multiple of 32 when it is computed.
    lse_len = _round_up(lq, 32) if compute_log_sumexp else sympy.S.Zero
    lse = _contiguous(torch.float32, (b, h, lse_len), query.device)
    # The kernel returns its philox seed and offset as CPU scalars.
    seed = _contiguous(torch.int64, (), "cpu")
    offset = _contiguous(torch.int64, (), "cpu")
    return out, lse, seed, offset


sdpa_efficient = _extern(
    "sdpa_efficient",
    "(Tensor query, Tensor key, Tensor value, Optional[Tensor] attn_bias, bool compute_log_sumexp, "
    "float dropout_p=0.0, bool is_causal=False, *, Optional[float] scale=None) -> "
    "(Tensor, Tensor, Tensor, Tensor)",
    _sdpa_efficient_meta,
    [aten._scaled_dot_product_efficient_attention.default],
    doc="memory-efficient attention: (out, log_sumexp, philox_seed, philox_offset)",
    rng_state=RngState(dropout=5, results=(2, 3)),
)


def _sdpa_efficient_backward_meta(grad_out_, query, key, value, attn_bias, out, logsumexp,
                                  philox_seed, philox_offset, dropout_p, grad_input_mask,
                                  is_causal=False, *, scale=None):  # fmt: skip
    _check_qkv("sdpa_efficient_backward", query, key, value)
    grads = list(_sdpa_grads(query, key, value))
    bias = None
    if grad_input_mask[3] and attn_bias is not None:
        # The kernel pads the bias grad's last dim to a multiple of 16 and returns a view.
        *lead, last = attn_bias.sizes
        padded = _round_up(last, 16)
        strides = utils.make_contiguous_strides_for((*lead, padded))
        bias = TensorMeta(attn_bias.dtype, attn_bias.sizes, strides, 0, attn_bias.device)
    return (*grads, bias)


sdpa_efficient_backward = _extern(
    "sdpa_efficient_backward",
    "(Tensor grad_out_, Tensor query, Tensor key, Tensor value, Tensor attn_bias, Tensor out, "
    "Tensor logsumexp, Tensor philox_seed, Tensor philox_offset, float dropout_p, "
    "bool[] grad_input_mask, bool is_causal=False, *, Optional[float] scale=None) -> "
    "(Tensor, Tensor, Tensor, Tensor)",
    _sdpa_efficient_backward_meta,
    [aten._scaled_dot_product_efficient_attention_backward.default],
    rng_state=RngState(dropout=9, args=(7, 8)),
)
# The memory-efficient backward reads `out` with a row stride of heads * head_dim whatever its
# strides say, so `out` must be in the (B, L, H, E) layout its forward wrote (a BHLE copy reads
# out of bounds: an illegal memory access on CUDA).
def _unit_last_stride(sizes, strides):
    """The layout as it is when its last dim has stride 1, else row-major: torch's CPU flash
    kernel reads q, k and v as if their last dim were contiguous (a transposed q gave wrong
    values, no error)."""
    if strides is not None and (strides[-1] == 1 or sizes[-1] == 1):
        return strides
    return utils.make_contiguous_strides_for(tuple(sizes))


ARG_STRIDES["extern.sdpa_flash_cpu"] = {i: _unit_last_stride for i in range(3)}
ARG_STRIDES["extern.sdpa_flash_cpu_backward"] = {i: _unit_last_stride for i in range(5)}
ARG_STRIDES["extern.sdpa_efficient"] = {3: _aligned_bias}
ARG_STRIDES["extern.sdpa_efficient_backward"] = {4: _aligned_bias, 5: lambda sizes, _: _blhe(sizes)}

def cudnn_output_strides(query_sizes, query_strides, out_sizes) -> tuple:
    """The layout torch gives cuDNN attention's output: the query's own (empty_like) when the
    shapes agree, else the query's dimension order, dense. Sizes may be sympy or ints."""
    if len(query_sizes) == len(out_sizes) and all(
        utils.known_eq(a, b) for a, b in zip(query_sizes, out_sizes)
    ):
        return utils.preserve_format_strides(query_sizes, query_strides)
    # outermost first; sorted() is stable with reverse=True, so equal strides keep dim order
    order = sorted(range(len(out_sizes)), key=lambda d: utils.sort_key(query_strides[d]),
                   reverse=True)  # fmt: skip
    return utils.strides_from_perm(out_sizes, order[::-1])


def in_cudnn_layout(out: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """`out` in the layout `cudnn_output_strides` declares, copied only when cuDNN wrote another.

    The cuDNN kernel allocates its output itself, and how has changed between torch and cuDNN
    versions (contiguous (B, H, L, E) in some, the query's layout in others): the extern promises
    the declared layout whatever this machine's versions do, so compiled code that reads the
    output by its declared strides is right on every version (a copy costs one pass over the
    output where they disagree; none where they agree, the usual case)."""
    strides = cudnn_output_strides(tuple(query.shape), query.stride(), tuple(out.shape))
    strides = tuple(int(s) for s in strides)
    if tuple(out.stride()) == strides:
        return out
    fixed = torch.empty_strided(out.shape, strides, dtype=out.dtype, device=out.device)
    return fixed.copy_(out)


_CUDNN_DTYPES = (torch.float16, torch.bfloat16)


def _sdpa_cudnn_meta(query, key, value, attn_bias=None, is_causal=False, *, scale=None):
    _check_qkv("sdpa_cudnn", query, key, value)
    if query.dtype not in _CUDNN_DTYPES:
        raise TypeError(f"extern.sdpa_cudnn: cuDNN attention takes float16 or bfloat16, got "
                        f"{query.dtype}")  # fmt: skip
    if attn_bias is not None and (attn_bias.ndim not in (2, 3, 4) or
                                  not utils.known_eq(attn_bias.sizes[-1], key.sizes[2])):
        raise ValueError(f"extern.sdpa_cudnn: attn_bias of sizes {attn_bias.sizes} for "
                         f"{key.sizes[2]} keys (2-, 3- or 4-d, last dim the keys)")  # fmt: skip
    out_sizes = (*query.sizes[:3], value.sizes[3])
    strides = cudnn_output_strides(query.sizes, query.strides, out_sizes)
    return TensorMeta(query.dtype, out_sizes, strides, 0, query.device)


def _sdpa_cudnn_ref(query, key, value, attn_bias=None, is_causal=False, *, scale=None):
    # inference: no log-sum-exp (nothing to differentiate), no dropout, no debug mask
    res = aten._scaled_dot_product_cudnn_attention(
        query, key, value, attn_bias, False, 0.0, is_causal, False, scale=scale
    )
    return in_cudnn_layout(res[0], query)


# Not in ATEN_TO_EXTERN: the ATen op returns nine values of which this is the first, and may be a
# training call. The tracer records it for the op's inference form alone (Tracer.
# _cudnn_for_inference), which attention.py calls where it chooses cuDNN.
sdpa_cudnn = _extern(
    "sdpa_cudnn",
    "(Tensor query, Tensor key, Tensor value, Optional[Tensor] attn_bias=None, "
    "bool is_causal=False, *, Optional[float] scale=None) -> Tensor",
    _sdpa_cudnn_meta,
    [aten._scaled_dot_product_cudnn_attention.default],
    ref=_sdpa_cudnn_ref,
    doc="cuDNN's fused attention, inference: the output alone, in cudnn_output_strides' layout",
    traced_from_aten=False,
)


def _unit_last_stride(sizes, strides):
    """cuDNN reads query, key and value rows with a unit stride: keep such a layout, else copy
    to a contiguous one."""
    if strides is not None and utils.known_eq(strides[-1], 1):
        return strides
    return utils.make_contiguous_strides_for(sizes)


# The bias in 16-element rows, the memory-efficient kernels' rule: cuDNN is told the bias's
# strides, so padded rows cost nothing but the padding, and its sm90 kernels load tiles through
# TMA, which wants 16-byte-aligned row strides (an unaligned key count is then never a question
# of which cuDNN version accepts it).
ARG_STRIDES["extern.sdpa_cudnn"] = {0: _unit_last_stride, 1: _unit_last_stride,
                                    2: _unit_last_stride, 3: _aligned_bias}  # fmt: skip


# --- sorting and scans ---------------------------------------------------------------------------


def _sort_meta(self, dim=-1, descending=False, *, stable=False):
    dim = utils.canonicalize_dim(self.ndim, dim)
    strides = utils.preserve_format_strides(self.sizes, self.strides)
    values = TensorMeta(self.dtype, self.sizes, strides, 0, self.device)
    return values, TensorMeta(torch.int64, self.sizes, strides, 0, self.device)


def _sort_stable(args, kwargs):
    kwargs = dict(kwargs)
    stable = kwargs.pop("stable", None)
    return args, {**kwargs, "stable": bool(stable)}


sort = _extern(
    "sort",
    "(Tensor self, int dim=-1, bool descending=False, *, bool stable=False) -> (Tensor, Tensor)",
    _sort_meta,
    [aten.sort.default, aten.sort.stable],
    ref=lambda self, dim=-1, descending=False, *, stable=False: aten.sort.stable(
        self, stable=stable, dim=dim, descending=descending
    ),
    adapt={aten.sort.stable: _sort_stable},
    doc="(values, indices) sorted along dim",
)


def _topk_meta(self, k, dim=-1, largest=True, sorted=True):
    dim = utils.canonicalize_dim(self.ndim, dim)
    sizes = self.sizes[:dim] + (as_expr(k),) + self.sizes[dim + 1 :]
    return _contiguous(self.dtype, sizes, self.device), _contiguous(torch.int64, sizes, self.device)


topk = _extern(
    "topk",
    "(Tensor self, int k, int dim=-1, bool largest=True, bool sorted=True) -> (Tensor, Tensor)",
    _topk_meta,
    [aten.topk.default],
)


def _scan_dtype(self, dtype):
    if dtype is not None:
        return dtype
    if utils.is_integer_dtype(self.dtype) or self.dtype is torch.bool:
        return torch.int64
    return self.dtype


def _cumulative_meta(self, dim, *, dtype=None):
    utils.canonicalize_dim(self.ndim, dim)
    return _contiguous(_scan_dtype(self, dtype), self.sizes, self.device)


cumsum = _extern(
    "cumsum",
    "(Tensor self, int dim, *, Optional[dtype] dtype=None) -> Tensor",
    _cumulative_meta,
    [aten.cumsum.default],
)
cumprod = _extern(
    "cumprod",
    "(Tensor self, int dim, *, Optional[dtype] dtype=None) -> Tensor",
    _cumulative_meta,
    [aten.cumprod.default],
)


def _cum_minmax_meta(self, dim):
    utils.canonicalize_dim(self.ndim, dim)
    return (_contiguous(self.dtype, self.sizes, self.device),
            _contiguous(torch.int64, self.sizes, self.device))  # fmt: skip


cummax = _extern(
    "cummax", "(Tensor self, int dim) -> (Tensor, Tensor)", _cum_minmax_meta, [aten.cummax.default]
)
cummin = _extern(
    "cummin", "(Tensor self, int dim) -> (Tensor, Tensor)", _cum_minmax_meta, [aten.cummin.default]
)
logcumsumexp = _extern(
    "logcumsumexp",
    "(Tensor self, int dim) -> Tensor",
    lambda self, dim: _contiguous(self.dtype, self.sizes, self.device),
    [aten.logcumsumexp.default],
)

# --- data-dependent sizes ------------------------------------------------------------------------

_UNBACKED = itertools.count()


def unbacked_symbol() -> sympy.Symbol:
    """A fresh size symbol ("u0", "u1", ...) for a size only known once the data is."""
    return sym(f"u{next(_UNBACKED)}")


def _nonzero_meta(self):
    n = unbacked_symbol()
    # torch stores nonzero's (n, ndim) result column-major.
    return TensorMeta(torch.int64, (n, self.ndim), (1, sympy.Max(n, 1)), 0, self.device)


nonzero = _extern(
    "nonzero",
    "(Tensor self) -> Tensor",
    _nonzero_meta,
    [aten.nonzero.default],
    tags=("data_dependent",),
    doc="indices of the non-zero elements, (n, ndim); n is a data-dependent size",
)


def _masked_select_meta(self, mask):
    if mask.dtype is not torch.bool:
        raise TypeError("extern.masked_select: mask must be bool")
    utils.broadcast_shapes(self.sizes, mask.sizes)
    return _contiguous(self.dtype, (unbacked_symbol(),), self.device)


masked_select = _extern(
    "masked_select",
    "(Tensor self, Tensor mask) -> Tensor",
    _masked_select_meta,
    [aten.masked_select.default],
    tags=("data_dependent",),
    doc="the elements of self where mask (broadcast) is True, flattened; data-dependent size",
)


from .custom import custom_op  # noqa: E402,F401  (extern ops are all reachable here)
