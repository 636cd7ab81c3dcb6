"""Runs a test file as two ranks (two processes over gloo) and reads what each reported.

The file is its own rank script: started with `--rank R --port P --out DIR CASE...`, it runs the
cases and writes DIR/rankR.json (a dict by case). A launch whose free port another process took
first (the port is chosen here, bound there) is tried once more.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script: str, tmp_path, cases: list) -> tuple:
    """Both ranks of `script` over `cases`: (processes, their combined output)."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    procs = [subprocess.Popen([sys.executable, script, "--rank", str(r), "--port", str(port),
                               "--out", str(tmp_path), *cases], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in (0, 1)]  # fmt: skip
    logs = [p.communicate(timeout=600)[0].decode(errors="replace") for p in procs]
    return procs, logs


def run_ranks(script: str, tmp_path, cases: list) -> list:
    """Both ranks' reports, once both exited cleanly (a failure shows the rank's output)."""
    procs, logs = launch(script, tmp_path, cases)
    if any(p.returncode for p in procs) and any("EADDRINUSE" in log or "address already in use"
                                                in log.lower() for log in logs):  # fmt: skip
        procs, logs = launch(script, tmp_path, cases)
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-6000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def rank_main(worker) -> None:
    """A rank's entry point: `worker(rank, port, out, cases)` from the command line `launch`
    gives."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int)
    parser.add_argument("--port", type=int)
    parser.add_argument("--out")
    parser.add_argument("cases", nargs="*")
    ns = parser.parse_args()
    worker(ns.rank, ns.port, ns.out, ns.cases)
