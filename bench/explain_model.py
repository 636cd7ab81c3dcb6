"""Graph and break report of one benchmark model under ember.explain, built and called as run.py
calls it (same weights, inputs, no_grad and autocast), so a model that splits into many graphs on
the device can be diagnosed in one short call.

    python bench/explain_model.py deberta-v3-base --mode infer-bf16
    python bench/explain_model.py small_bert --device cpu --seq-len 32
"""

import argparse
import collections
import dataclasses
import sys

import _paths  # noqa: F401 - puts the Ember components on sys.path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--mode", default="infer-bf16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--reasons", type=int, default=12, help="how many distinct reasons to print")
    args = p.parse_args(argv)
    import harness
    import measure

    import ember.dynamo

    timing = measure.Timing(warmup=1, iters=1, max_seconds=1.0)
    cfg = {"model": args.model, "mode": args.mode, "device": args.device,
           "batch": args.batch_size, "seq": args.seq_len, "timing": dataclasses.asdict(timing)}
    harness.configure_process(dict(cfg, threads=None))
    task = harness.Task(cfg)
    model = task.fresh()
    with task.outer():
        report = ember.dynamo.explain(model)(*task.inputs)
    print(f"{args.model} ({args.mode}, {args.device}): {report.graph_count} graphs, "
          f"{report.graph_break_count} breaks")
    counts = collections.Counter(str(r) for r in report.break_reasons)
    for reason, n in counts.most_common(args.reasons):
        print(f"  {n} x {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
