"""The extern ops the C++ runtime implements, and how an artifact's extern step calls them.

An extern step names a vocabulary op (`extern.mm`, ...) with arguments in ember.ir's JSON form
({"node": buffer} for tensors); each entry below says which arguments are tensors (passed to the
runtime as strided views, followed by the step's output) and which are ints or floats.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

from .custom_kernels import missing_kernel_message
from .errors import UnsupportedArtifactError

# Values of ember_abi::ExternOp in csrc/detail/model_abi.h.
OP_MM, OP_BMM, OP_ADDMM, OP_CONVOLUTION, OP_COPY, OP_BADDBMM = 1, 2, 3, 4, 5, 6
OP_CUMSUM, OP_CUMPROD, OP_LOGCUMSUMEXP, OP_CUMMAX, OP_CUMMIN, OP_SORT, OP_TOPK = range(7, 14)
OP_INDEX_COPY = 14  # a donated input's in-place update (decode.py), not a vocabulary op


@dataclasses.dataclass(frozen=True)
class ExternSpec:
    op_id: int
    params: tuple[str, ...]
    defaults: Mapping[str, Any]
    tensors: tuple[str, ...]  # in the order the runtime takes them; the output follows
    optional: frozenset = frozenset()  # tensors that may be None (passed as a null view)
    ints: Callable[[dict], Sequence[int]] = lambda b: ()
    floats: Callable[[dict], Sequence[float]] = lambda b: ()
    devices: tuple[str, ...] = ("cpu", "cuda")  # where csrc/runtime/externs.cc runs it
    outputs: int = 1  # the step's outputs, passed in order after the input tensors


def _pair(value, fill, spatial: int) -> list[int]:
    """A conv parameter as the runtime's (h, w) pair: a 1-D conv runs as 2-D with h = 1."""
    items = [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]
    if len(items) == 1:
        items = items * spatial
    if spatial == 1 and len(items) == 1:
        return [fill, items[0]]
    if spatial == 2 and len(items) == 2:
        return items
    raise UnsupportedArtifactError("the C++ runtime runs 1-D and 2-D convolutions only")


def _conv_ints(b: dict) -> list[int]:
    spatial = b["__spatial__"]
    if b["transposed"]:
        raise UnsupportedArtifactError("transposed convolution has no C++ runtime kernel yet")
    if spatial not in (1, 2):
        raise UnsupportedArtifactError(
            f"a {spatial}-D convolution (the C++ runtime runs 1-D and 2-D)"
        )
    return [
        *_pair(b["stride"], 1, spatial),
        *_pair(b["padding"], 0, spatial),
        *_pair(b["dilation"], 1, spatial),
        int(bool(b["transposed"])),
        int(b["groups"]),
    ]


def _static_int(b: dict, key: str, op: str) -> int:
    value = b[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise UnsupportedArtifactError(f"{op} with a non-constant {key} ({value!r})")
    return value


def _scan(op_id: int, name: str, outputs: int = 1, dtype: bool = True) -> ExternSpec:
    """A cumulative op along `dim` (scans.cc); the output buffer's dtype is the result's."""
    return ExternSpec(
        op_id,
        ("self", "dim", "dtype") if dtype else ("self", "dim"),
        {"dtype": None} if dtype else {},
        ("self",),
        ints=lambda b: (_static_int(b, "dim", name),),
        devices=("cpu",),
        outputs=outputs,
    )


EXTERN_OPS: dict[str, ExternSpec] = {
    "extern.mm": ExternSpec(OP_MM, ("self", "mat2"), {}, ("self", "mat2")),
    "extern.bmm": ExternSpec(OP_BMM, ("self", "mat2"), {}, ("self", "mat2")),
    "extern.addmm": ExternSpec(
        OP_ADDMM,
        ("self", "mat1", "mat2", "beta", "alpha"),
        {"beta": 1.0, "alpha": 1.0},
        ("self", "mat1", "mat2"),
        floats=lambda b: (float(b["beta"]), float(b["alpha"])),
    ),
    "extern.baddbmm": ExternSpec(
        OP_BADDBMM,
        ("self", "batch1", "batch2", "beta", "alpha"),
        {"beta": 1.0, "alpha": 1.0},
        ("self", "batch1", "batch2"),
        floats=lambda b: (float(b["beta"]), float(b["alpha"])),
        devices=("cpu",),
    ),
    "extern.convolution": ExternSpec(
        OP_CONVOLUTION,
        (
            "input",
            "weight",
            "bias",
            "stride",
            "padding",
            "dilation",
            "transposed",
            "output_padding",
            "groups",
        ),
        {
            "bias": None,
            "stride": [1],
            "padding": [0],
            "dilation": [1],
            "transposed": False,
            "output_padding": [0],
            "groups": 1,
        },
        ("input", "weight", "bias"),
        optional=frozenset({"bias"}),
        ints=_conv_ints,
        devices=("cpu",),  # CUDA packages get im2col + matmul (config.conv_as_matmul)
    ),
    "extern.cumsum": _scan(OP_CUMSUM, "extern.cumsum"),
    "extern.cumprod": _scan(OP_CUMPROD, "extern.cumprod"),
    "extern.logcumsumexp": _scan(OP_LOGCUMSUMEXP, "extern.logcumsumexp", dtype=False),
    "extern.cummax": _scan(OP_CUMMAX, "extern.cummax", outputs=2, dtype=False),
    "extern.cummin": _scan(OP_CUMMIN, "extern.cummin", outputs=2, dtype=False),
    # Always a stable sort: a valid answer for stable=False too (ties keep their order).
    "extern.sort": ExternSpec(
        OP_SORT,
        ("self", "dim", "descending", "stable"),
        {"dim": -1, "descending": False, "stable": False},
        ("self",),
        ints=lambda b: (_static_int(b, "dim", "extern.sort"), int(bool(b["descending"]))),
        devices=("cpu",),
        outputs=2,
    ),
    # Always sorted: a valid answer for sorted=False too (torch leaves that order unspecified).
    "extern.topk": ExternSpec(
        OP_TOPK,
        ("self", "k", "dim", "largest", "sorted"),
        {"dim": -1, "largest": True, "sorted": True},
        ("self",),
        ints=lambda b: (
            _static_int(b, "k", "extern.topk"),
            _static_int(b, "dim", "extern.topk"),
            int(bool(b["largest"])),
        ),
        devices=("cpu",),
        outputs=2,
    ),
}


# Attention externs (calls into torch's kernels) that ember.inductor replaces with a flash kernel
# of its own when it compiles for a package: the generated C++ kernel on the CPU, the Triton
# kernel (a cubin) on CUDA. One that reaches an artifact is a call those kernels do not take.
LOWERED_FOR_PACKAGES = {
    "extern.sdpa_flash_cpu": "cpu",
    "extern.sdpa_flash": "cuda",
    "extern.sdpa_efficient": "cuda",
    "extern.sdpa_cudnn": "cuda",
}


def _vocabulary_names(target: str) -> tuple[str, ...]:
    """The op's argument names as the vocabulary defines them (when primtorch has defined it)."""
    try:
        from ember.ir import lookup

        return tuple(a.name for a in lookup(target).args)
    except KeyError:
        return ()


def bind_extern(target: str, args: Sequence, kwargs: Mapping,
                device: str = "cpu") -> tuple[ExternSpec, dict]:  # fmt: skip
    """The spec of `target` and its arguments by our parameter names (JSON form, unresolved)."""
    if target == "extern.custom_op":
        raise UnsupportedArtifactError(missing_kernel_message(args[0] if args else "?", args))
    if target in LOWERED_FOR_PACKAGES:
        raise UnsupportedArtifactError(
            f"{target}: an attention call that Ember's own flash kernel does not take (dropout, "
            "a read log-sum-exp, symbolic heads or head dims, head dims above 256 on CUDA, an "
            "integer mask; see ember.inductor.triton_attention and cpu_attention), so it stays "
            "a call into torch, which packages cannot make; run it with the Python wrapper"
        )
    spec = EXTERN_OPS.get(target)
    if spec is None or device not in spec.devices:
        known = ", ".join(sorted(n for n, s in EXTERN_OPS.items() if device in s.devices))
        raise UnsupportedArtifactError(
            f"extern op {target!r} has no C++ runtime implementation on {device} (it has: "
            f"{known}); run this artifact with the Python wrapper instead"
        )
    if len(args) > len(spec.params):
        raise UnsupportedArtifactError(
            f"{target}: {len(args)} positional arguments, expected at most {len(spec.params)}"
        )
    bound = dict(spec.defaults)
    bound.update(zip(spec.params, args))
    vocab = _vocabulary_names(target)
    for key, value in (kwargs or {}).items():
        if key in spec.params:
            bound[key] = value
        elif key in vocab and vocab.index(key) < len(spec.params):
            bound[spec.params[vocab.index(key)]] = value
        else:
            raise UnsupportedArtifactError(f"{target}: unknown keyword argument {key!r}")
    missing = [p for p in spec.params if p not in bound]
    if missing:
        raise UnsupportedArtifactError(f"{target}: missing arguments {missing}")
    return spec, bound
