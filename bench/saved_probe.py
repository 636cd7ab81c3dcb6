"""What a training step keeps for the backward under eager, torch.compile and Ember, measured the
same way for all three (autograd's saved-tensor hooks), plus Ember's own partition listing.

    python bench/saved_probe.py                       # GPT-2, 2 layers, n_embd 256, fp32 and bf16
    python bench/saved_probe.py --layers 2 --embd 256 --seq 128 --batch 2 --vocab 50257 --no-torch

Every compiled forward saves its activations through autograd (torch's and Ember's runtimes call
`ctx.save_for_backward`), so a pack hook sees them all; values are deduplicated by storage, and a
storage that belongs to a parameter or an input is counted apart (it is alive anyway).
"""

import argparse
import contextlib
import collections

import _paths  # noqa: F401  (puts the components on sys.path)
import torch

MiB = 1 << 20


def gpt2(layers, embd, heads, vocab, seq):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=layers, n_embd=embd, n_head=heads, vocab_size=vocab, n_positions=seq)
    return GPT2LMHeadModel(cfg).train()


def hooked_saved(step, model, ids):
    """Run `step` once under saved-tensor hooks: (rows, held bytes, alive-anyway bytes)."""
    alive = {p.untyped_storage().data_ptr() for p in model.parameters()}
    alive.add(ids.untyped_storage().data_ptr())
    seen = {}

    def pack(t):
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            key = st.data_ptr()
            if key not in seen:
                seen[key] = (tuple(t.shape), t.dtype, st.nbytes(), key in alive)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = step(ids)
    loss.backward()
    rows = list(seen.values())
    held = sum(r[2] for r in rows if not r[3])
    anyway = sum(r[2] for r in rows if r[3])
    return rows, held, anyway


def step_peak(step, model, ids, timeline=False):
    """Peak of live CPU allocations during forward+backward, above what was live before (bytes),
    read from the profiler's allocator events ("Total Allocated" after each event)."""
    import json
    import os
    import tempfile

    model.zero_grad(set_to_none=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        step(ids).backward()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        events = json.load(open(path))["traceEvents"]
    mem = [e["args"] for e in events if e.get("name") == "[memory]"]
    if not mem:
        return 0
    start = mem[0]["Total Allocated"] - mem[0]["Bytes"]
    if timeline:  # every allocation or free of 4 MiB or more, with the op it happened in
        ops = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"),
                     key=lambda e: e["ts"])
        for e in (e for e in events if e.get("name") == "[memory]"):
            a = e["args"]
            if abs(a["Bytes"]) < 4 * MiB:
                continue
            inner = [o["name"] for o in ops if o["ts"] <= e["ts"] <= o["ts"] + o["dur"]]
            print(f"      {a['Bytes'] / MiB:+9.2f} -> {(a['Total Allocated'] - start) / MiB:8.2f}"
                  f"  {' / '.join(inner[-3:])}")
    return max(m["Total Allocated"] for m in mem) - start


def summarize(rows, top=12):
    by = collections.Counter()
    for shape, dtype, nbytes, alive in rows:
        if not alive:
            by[(shape, str(dtype).replace("torch.", ""))] += nbytes
    return by.most_common(top)


@contextlib.contextmanager
def ember_listing(records):
    """Record each min-cut partition's saved values (name, op, shape, dtype, bytes)."""
    from ember.aot_autograd import partition as P
    from ember.ir import NODE_META_KEY

    original = P._build

    def build(j, saved):
        rows = []
        for n in saved:
            meta = n.meta.get(NODE_META_KEY)
            op = "placeholder" if n.op == "placeholder" else (P.target_name_or_none(n) or str(n.target))
            src = ""
            if "view" in P.op_tags(n) or op == "getitem":
                base = n.args[0]
                while isinstance(base, torch.fx.Node) and "view" in P.op_tags(base):
                    base = base.args[0]
                src = f" of {base.name} ({P.target_name_or_none(base) or base.op})"
            rows.append((n.name, op + src, tuple(getattr(meta, "sizes", ())),
                         getattr(meta, "dtype", None), P.value_bytes(n), n.op == "placeholder"))
        records.append(rows)
        return original(j, saved)

    P._build = build
    try:
        yield
    finally:
        P._build = original


def print_rows(title, rows, held, anyway):
    print(f"  {title}: held {held / MiB:.2f} MiB (+ {anyway / MiB:.2f} MiB params/inputs)")
    for (shape, dtype), nbytes in summarize(rows):
        print(f"      {nbytes / MiB:8.2f} MiB  {dtype:9s} {list(shape)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--no-torch", action="store_true", help="skip torch.compile")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--ember-backend", default="aot_eager", help="aot_eager or inductor")
    ap.add_argument("--timeline", action="store_true", help="big allocations of the step")
    ap.add_argument("--listing", action="store_true", help="print every value Ember saves")
    args = ap.parse_args()

    import ember

    for mode in args.dtypes.split(","):
        amp = (torch.autocast("cpu", dtype=torch.bfloat16) if mode == "bf16"
               else contextlib.nullcontext())  # fmt: skip
        print(f"== GPT-2 {args.layers}x{args.embd}, batch {args.batch} x {args.seq}, "
              f"vocab {args.vocab}, {mode}")
        model = gpt2(args.layers, args.embd, args.heads, args.vocab, args.seq)
        ids = torch.randint(0, args.vocab, (args.batch, args.seq))

        def stepper(fn):
            def step(x):
                with amp:
                    return fn(input_ids=x, labels=x).loss
            return step

        results = {"eager": stepper(model)}
        if not args.no_torch:
            results["torch.compile"] = stepper(torch.compile(model))
        records = []
        results["ember"] = stepper(ember.compile(model, backend=args.ember_backend))
        for name, step in results.items():
            cm = ember_listing(records) if name == "ember" else contextlib.nullcontext()
            with cm:
                hooked_saved(step, model, ids)  # warm-up: compiles
            rows, held, anyway = hooked_saved(step, model, ids)
            print_rows(name, rows, held, anyway)
            print(f"    fwd+bwd peak above start: {step_peak(step, model, ids, args.timeline) / MiB:.2f} MiB")
        total = sum(b for rows in records for *_, b, ph in rows if not ph)
        print(f"  ember partition: {sum(len(r) for r in records)} saved values in "
              f"{len(records)} graph(s), {total / MiB:.2f} MiB not counting inputs")
        if args.listing:
            for rows in records:
                for name, op, shape, dtype, nbytes, ph in rows:
                    dt = str(dtype).replace("torch.", "")
                    print(f"      {nbytes / MiB:8.3f} MiB  {dt:9s} {str(list(shape)):22s} "
                          f"{name}: {op}")
        torch._dynamo.reset()
        ember.reset()


if __name__ == "__main__":
    main()
