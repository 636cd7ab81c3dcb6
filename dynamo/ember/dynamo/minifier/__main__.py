"""`python -m ember.dynamo.minifier FILE`: minify the graph of a saved repro file (the
original.py that EMBER_REPRO writes, or any repro.py) and write the smaller repro."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .checks import accuracy_predicate, error_predicate
from .reprofile import ReproError, backend_by_name, load_repro, trace, write_repro
from .search import MinifierError, minify


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ember.dynamo.minifier",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("file", help="a repro file (original.py written by EMBER_REPRO)")
    parser.add_argument("-o", "--out", help="where to write the minimized repro "
                        "(default: repro.py beside original.py, else FILE_min.py)")  # fmt: skip
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="stop searching after this long (the smallest graph so far is kept)")
    args = parser.parse_args(argv)

    try:
        saved = load_repro(args.file)
        backend = backend_by_name(saved.backend.name, saved.backend.module, saved.backend.options)
    except ReproError as e:
        print(f"{args.file}: {e}", file=sys.stderr)
        return 2
    inputs = saved.inputs()
    gm = trace(saved.module_class(), inputs)
    if saved.mode == "error":
        if saved.expected is None:
            print(f"{args.file}: error mode needs EXPECTED (the exception)", file=sys.stderr)
            return 2
        fails = error_predicate(backend, saved.expected)
    else:
        fails = accuracy_predicate(backend, saved.tolerance)
    try:
        small = minify(gm, inputs, fails, random_inputs=saved.input_values is None,
                       max_seconds=args.max_seconds)  # fmt: skip
    except MinifierError as e:
        print(f"{args.file}: {e}: the failure does not reproduce", file=sys.stderr)
        return 1
    path = Path(args.file)
    default = "repro.py" if path.name == "original.py" else f"{path.stem}_min.py"
    out = Path(args.out) if args.out else path.with_name(default)
    what = saved.expected if saved.mode == "error" else "result unlike eager's"
    write_repro(out, small.gm, small.specs, saved.backend, saved.mode, saved.expected,
                title=f"A minimized graph of {path.name} (backend {saved.backend.name!r}).",
                details=f"Failure: {what}\n{small.ops_after} of {small.ops_before} calls kept "
                f"({small.tests} tries, {small.seconds:.1f} s).\n",
                input_values=None if saved.input_values is None else small.inputs,
                tolerance=saved.tolerance)  # fmt: skip
    print(f"{out}: {small.ops_after} of {small.ops_before} calls kept ({small.tests} tries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
