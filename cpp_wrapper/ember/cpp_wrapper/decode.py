"""Decode-step packages: one step of an autoregressive decoder whose KV caches are inputs that the
package updates in place (the caller's buffers, donated), for `ember_generate` in C++.

The user's step is `model(*inputs) -> logits` (or a tuple holding them) where the inputs are the
token ids (B, 1), the positions (1,) and the caches, each cache written in place with
`cache.index_copy_(dim, positions, new)` or `cache[..., positions, ...] = new`. Packaging:

1. export `lambda *x: (model(*x with caches cloned), *clones)`: ember.export takes only
   functional programs, and the clones make the writes a functional `prims.index_put` of the
   cache whose result the program returns (so the write is not dead code);
2. drop the clones from the prim graph (a clone equals its input), so the update reads the input;
3. compile (ember.inductor) and rewrite the artifact (`donate_index_puts`): each
   `prims.index_put(cache_view, [index], values)` whose old value nothing reads afterwards
   becomes an in-place write of `values` into the input (the runtime's kIndexCopy: O(new
   tokens)), its result a view of the input; the returned caches leave the outputs; on CUDA
   the writes are launches of a kernel that reads the positions on the GPU
   (cuda_index_copy.py), not host copies after a synchronisation;
4. package it, and record in manifest.json which inputs are the tokens, positions and caches,
   which output the logits (the "decode" entry ember_generate reads) and the caches' length;
   a CUDA package also carries a kernel that chooses greedy tokens on the GPU (cuda_greedy.py,
   the entry's "greedy_kernel").
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Optional, Sequence

import torch

from ember.ir import INPUT_UPDATES_META_KEY, CompiledArtifact, StepIR

from .codegen_values import step_refs
from .cuda_greedy import add_greedy_kernel
from .cuda_index_copy import launch_index_copies
from .errors import UnsupportedArtifactError
from .exported import compile_exported, resolve_entry
from .package import package

DECODE_KEY = "decode"
NEW_TOKENS = "new_tokens"  # the dynamic size of a prefill-capable step's tokens and positions


class _ClonedCaches(torch.nn.Module):
    """The user's step on clones of the caches, returning the model's outputs then the clones."""

    def __init__(self, model, caches: Sequence[int]):
        super().__init__()
        self.model, self.caches = model, tuple(caches)

    def forward(self, *inputs):
        args = list(inputs)
        clones = [args[i].clone() for i in self.caches]
        for i, c in zip(self.caches, clones):
            args[i] = c
        out = self.model(*args)
        outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        return (*outs, *clones)


def decode_step_artifact(model, example_inputs: Sequence[torch.Tensor], *, tokens: int,
                         positions: int, caches: Sequence[int], logits: int = 0,
                         max_new_tokens: int = 1,
                         device: str = "cpu") -> tuple[CompiledArtifact, dict, dict]:  # fmt: skip
    """The compiled step with its caches updated in place, its constants, and the manifest's
    "decode" entry (what `package_decode_step` packages; see there for the arguments)."""
    example_inputs = list(example_inputs)
    caches = [int(c) for c in caches]
    _check_roles(example_inputs, tokens, positions, caches)
    dims = None
    if max_new_tokens > 1:
        dims = _prefill_dims(len(example_inputs), tokens, positions, max_new_tokens)
    exported = resolve_entry("export")(_ClonedCaches(model, caches), tuple(example_inputs),
                                       dynamic_shapes=dims)  # fmt: skip
    n_out = len(exported.outputs) - len(caches)
    if not 0 <= logits < n_out:
        raise ValueError(f"logits={logits}, but the model returns {n_out} tensors")
    _drop_cache_clones(exported.graph_module, caches, len(example_inputs))
    # the caches' new values are outputs n_out..: marked so (as aot_autograd marks a module's
    # mutated buffers), the compiler writes each update into its cache (an IndexedWrite kernel
    # fused with the rows' producer on CUDA, an in-place index_put elsewhere)
    exported.graph_module.meta[INPUT_UPDATES_META_KEY] = {
        n_out + k: c for k, c in enumerate(caches)}  # fmt: skip
    artifact, consts = compile_exported(exported, device)
    donated = [artifact.inputs[i] for i in caches]
    artifact, lengths = donate_index_puts(artifact, donated, artifact.outputs[n_out:])
    cuda = torch.device(device).type == "cuda"
    if cuda:  # the updates on the GPU, not through the host
        artifact = launch_index_copies(artifact)
    spec = {"tokens": tokens, "positions": positions, "caches": caches, "logits": logits,
            "max_positions": min(lengths)}  # fmt: skip
    if max_new_tokens > 1:
        if max_new_tokens > spec["max_positions"]:
            raise ValueError(f"max_new_tokens={max_new_tokens} exceeds the caches' length "
                             f"{spec['max_positions']}")  # fmt: skip
        spec["max_new_tokens"] = max_new_tokens
    if cuda:  # greedy generation chooses tokens on the GPU
        artifact, spec = add_greedy_kernel(artifact, spec)
    return artifact, consts, spec


def _prefill_dims(n_inputs: int, tokens: int, positions: int, most: int) -> list:
    """dynamic_shapes giving the tokens' and positions' length the range [1, `most`] (export
    checks that the step traced for two or more new tokens is the step for one)."""
    new = resolve_entry("Dim")(NEW_TOKENS, min=1, max=most)
    dims: list = [None] * n_inputs
    dims[tokens], dims[positions] = {1: new}, {0: new}
    return dims


def package_decode_step(model, example_inputs: Sequence[torch.Tensor], path, *, tokens: int,
                        positions: int, caches: Sequence[int], logits: int = 0,
                        max_new_tokens: int = 1, device: str = "cpu",
                        include_dirs: Sequence[str] = (),
                        defines: Sequence[str] = ()) -> Path:  # fmt: skip
    """Package one decoder step whose caches are updated in place; returns the package path.

    `tokens`, `positions` and `caches` are indices into `example_inputs` (every input is one of
    them), `logits` the index of the logits among the model's outputs. The package runs with
    `ember_model_run` (the caches are written in place) and with `ember_generate`.

    `max_new_tokens` > 1 exports the tokens (B, T) and positions (T,) with T dynamic in
    [1, max_new_tokens] (a step attending causally within the new tokens and to the cache's
    earlier rows, its mask computed from the positions; ember.export refuses a step that is
    another program at T = 1): `ember_generate` then runs a prompt in calls of up to that many
    tokens, then one token per call. 1 (the default) is the static
    one-token step, whose prompts `ember_generate` feeds token by token."""
    artifact, consts, spec = decode_step_artifact(model, example_inputs, tokens=tokens,
                                                  positions=positions, caches=caches,
                                                  logits=logits, max_new_tokens=max_new_tokens,
                                                  device=device)  # fmt: skip
    path = package((artifact, consts), path, device, include_dirs=include_dirs, defines=defines)
    manifest_path = Path(path) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest[DECODE_KEY] = spec
    manifest["mutated_inputs"] = spec["caches"]  # written in place by every run
    tmp = manifest_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, manifest_path)
    return Path(path)


def _check_roles(inputs, tokens: int, positions: int, caches: Sequence[int]) -> None:
    roles = [tokens, positions, *caches]
    if sorted(roles) != list(range(len(inputs))):
        raise ValueError(f"tokens={tokens}, positions={positions} and caches={list(caches)} must "
                         f"name each of the {len(inputs)} inputs once: ember_generate feeds "
                         "every input")  # fmt: skip
    for name, i in (("tokens", tokens), ("positions", positions)):
        t = inputs[i]
        if t.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"{name} (input {i}) must be int64 or int32, not {t.dtype}")
    if inputs[tokens].dim() != 2 or inputs[positions].dim() != 1:
        raise ValueError("tokens must be (batch, new tokens) and positions (new tokens,)")
    for i in caches:
        if not inputs[i].is_floating_point():
            raise TypeError(f"cache input {i} must be floating point, not {inputs[i].dtype}")


def _drop_cache_clones(gm: torch.fx.GraphModule, caches: Sequence[int], n_inputs: int) -> None:
    """Replace each cache's clone by the cache itself (values are equal: the graph is
    functional); `donate_index_puts` later checks that no read of the old value follows."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"][:n_inputs]
    for i in caches:
        p = placeholders[i]
        users = list(p.users)
        if len(users) != 1 or str(users[0].target) != "prims.clone":
            raise UnsupportedArtifactError(f"cache input {i} is read other than through its "
                                           "update; the packaged step could not write it in "
                                           "place")  # fmt: skip
        users[0].replace_all_uses_with(p)
        gm.graph.erase_node(users[0])
    gm.graph.lint()
    gm.recompile()


def _layout(artifact: CompiledArtifact, views: dict, name: str) -> tuple:
    """(sizes, strides, storage offset) of a buffer, as its view step or its meta says."""
    if name in views:
        return views[name]
    m = artifact.buffer(name).meta
    return (tuple(int(s) for s in m.sizes), tuple(int(s) for s in m.strides),
            int(m.storage_offset))  # fmt: skip


def _is_static(layout) -> bool:
    """Are a view's sizes, strides and offset all integers (not the new tokens' count)?"""
    sizes, strides, offset = layout
    return all(isinstance(x, int) or getattr(x, "is_Integer", False)
               for x in (*sizes, *strides, offset))  # fmt: skip


def _same_elements(a: tuple, b: tuple) -> bool:
    """Do two layouts address the same elements (a size-1 dimension's stride is free)?"""
    return a[0] == b[0] and a[2] == b[2] and all(
        n == 1 or x == y for n, x, y in zip(a[0], a[1], b[1]))


def _ref(value) -> Optional[str]:
    if isinstance(value, dict) and set(value) == {"node"}:
        return value["node"]
    return value if isinstance(value, str) else None


def donate_index_puts(
    artifact: CompiledArtifact, donated: Sequence[str], cache_outputs: Sequence[str]
) -> tuple[CompiledArtifact, list[int]]:
    """`artifact` with each donated input updated in place by its `prims.index_put` step, and
    `cache_outputs` (the inputs' new values) dropped from its outputs; also each cache's length
    (the size of its indexed dimension). Raises UnsupportedArtifactError when an update is not an
    index_put of the input with one index tensor, or the old value is read after it."""
    roots: dict[str, str] = {n: n for n in artifact.inputs}
    views: dict[str, tuple] = {}
    stale: dict[str, str] = {}  # buffer -> the donated input whose old value it holds
    updated: dict[str, int] = {}  # donated input -> the length of its indexed dimension
    steps = []
    freed: set[str] = set()  # names of updated caches' storage the plan has freed
    for step in artifact.steps:
        if step.kind == "free":
            freed.update(n for n in map(_ref, step.args) if roots.get(n) in updated)
        elif freed & step_refs(step):  # the plan hands the storage on: it is the caller's
            raise UnsupportedArtifactError(
                f"the compiled plan reuses the storage of a cache update "
                f"({sorted(freed & step_refs(step))[0]}) for another buffer; the cache belongs "
                "to the caller")
        if step.kind != "free":
            old = sorted(r for r in step_refs(step) if r in stale)
            if old:
                raise UnsupportedArtifactError(
                    f"the step reads the old value of cache input {stale[old[0]]!r} after "
                    f"updating it ({step.kind} {step.target or ''} reads {old[0]}); a cache "
                    "must be read only after its update to be written in place")
        if step.kind == "view":
            src = _ref(step.args[0])
            roots[step.outputs[0]] = roots.get(src, src)
            if step.args[1] is not None and _is_static(step.args[1]):
                sizes, strides, offset = step.args[1]  # (a cache's views are static)
                views[step.outputs[0]] = (tuple(map(int, sizes)), tuple(map(int, strides)),
                                          int(offset))  # fmt: skip
        target = _in_place_target(step, roots, donated)
        if target is None:
            steps.append(step)
            continue
        x, out = _ref(step.args[0]), step.outputs[0]
        if roots.get(_ref(step.args[2])) == target:
            raise UnsupportedArtifactError(f"cache input {target!r} is updated with rows of "
                                           "itself; copy them first")  # fmt: skip
        layout = _layout(artifact, views, out)
        if not _same_elements(_layout(artifact, views, x), layout):
            raise UnsupportedArtifactError(f"the update of cache input {target!r} has another "
                                           "layout than the cache")  # fmt: skip
        for b, r in roots.items():  # every name of the old value
            if r == target and b != out:
                stale[b] = target
        roots[out] = target
        views[out] = layout
        updated[target] = layout[0][0]
        steps.append(StepIR("view", "", [x, [list(layout[0]), list(layout[1]), layout[2]]], {},
                            (out,)))  # fmt: skip
        args = [{"node": out}, step.args[1], step.args[2], False]
        steps.append(StepIR("extern", "prims.index_put", args, {"in_place": True}, (out,)))
    for name, d in zip(cache_outputs, donated):
        if d not in updated:  # written by a kernel of the program (an IndexedWrite)
            length = _written_rows(artifact, name, d)
            if length is not None:
                updated[d] = length
    missing = [d for d in donated if d not in updated]
    if missing:
        raise UnsupportedArtifactError(
            f"cache inputs {missing} are not updated by an index_copy_ (or an indexed "
            "assignment) at a tensor of positions; a decode step writes each cache once")
    for name, d in zip(cache_outputs, donated):
        if roots.get(name) != d:
            raise UnsupportedArtifactError(f"the program returns cache input {d!r}'s new value "
                                           "as a copy, not the in-place update")  # fmt: skip
    outputs = tuple(o for o in artifact.outputs if o not in set(cache_outputs))
    for o in outputs:
        if roots.get(o) in updated:
            raise UnsupportedArtifactError(f"output {o} is a view of a cache; return a copy")
    new = dataclasses.replace(artifact, steps=tuple(steps), outputs=outputs)
    return new, [updated[d] for d in donated]


def _written_rows(artifact: CompiledArtifact, output: str, cache: str) -> Optional[int]:
    """The length of the written dimension of `cache`, where the program's `output` (its new
    value) is a view of the view a kernel writes rows of (inductor's IndexedWrite: a view step
    of the input itself, its written dimension first), or None. The compiler made that write
    only where nothing read the old value."""
    source = {s.outputs[0]: s for s in artifact.steps if s.kind == "view"}
    step = source.get(output)
    while step is not None and _ref(step.args[0]) != cache:
        step = source.get(_ref(step.args[0]))
    if step is None or step.args[1] is None or not _is_static(step.args[1]):
        return None
    return int(step.args[1][0][0])


def _in_place_target(step, roots: dict, donated: Sequence[str]) -> Optional[str]:
    """The donated input a `prims.index_put(x, [index], values, False)` step updates (x a view
    of that input or the input itself), or None for any other step."""
    if step.kind != "extern" or step.target != "prims.index_put" or \
            (step.kwargs and step.kwargs != {"in_place": True}):  # fmt: skip
        return None
    args = step.args
    if len(args) != 4 or args[3] is not False or not isinstance(args[1], (list, tuple)):
        return None
    if len(args[1]) != 1 or _ref(args[1][0]) is None or _ref(args[2]) is None:
        return None
    root = roots.get(_ref(args[0]))
    return root if root in donated else None


def run_count(model) -> int:
    """Runs of a loaded package since loading (`ember_model_run_count`): one per step call."""
    return int(getattr(model, "_native", model).run_count())


def generate(model, prompt: torch.Tensor, max_new_tokens: int, *, top_k: int = 1,
             temperature: float = 1.0, seed: int = 0) -> torch.Tensor:  # fmt: skip
    """`ember_generate` on a decode-step package loaded in process (`load_package`): the
    (batch, max_new_tokens) int64 tokens after `prompt` (batch, prompt_len)."""
    native = getattr(model, "_native", model)
    prompt = prompt.detach().to(torch.int64).contiguous()
    if prompt.dim() != 2:
        raise ValueError(f"the prompt must be (batch, length), got {tuple(prompt.shape)}")
    out = native.generate(prompt.tolist(), int(max_new_tokens), int(top_k), float(temperature),
                          int(seed))  # fmt: skip
    return torch.tensor(out, dtype=torch.int64).reshape(prompt.shape[0], int(max_new_tokens))
