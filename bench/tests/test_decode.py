"""bench/decode.py on a tiny Llama: every variant runs, and each quantized one's logits match its
dequantized float model."""

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))

import decode


def test_tiny_decode_runs_and_checks_logits(tmp_path):
    cfg = decode._args(["--device", "cpu", "--layers", "1", "--hidden", "64", "--heads", "2",
                        "--kv-heads", "1", "--intermediate", "128", "--vocab", "96",
                        "--max-len", "16", "--tokens", "2", "--check-steps", "2", "--dtype", "fp32",
                        "--group-size", "32", "--backends", "eager,ember",
                        "--out", str(tmp_path)])  # fmt: skip
    rows = decode.main(cfg)
    assert [(r["weights"], r["backend"]) for r in rows] == [
        (w, b) for w in ("fp32", "int8", "int4") for b in ("eager", "ember")]
    assert all("error" not in r and r["tokens_per_s"] > 0 for r in rows), rows
    quantized = [r for r in rows if r["weights"] != "fp32"]
    assert all(r["check"] == "ok" for r in quantized), quantized
    assert (tmp_path / "results.md").exists()
