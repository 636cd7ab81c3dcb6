"""profile_diff.py's parsing on synthetic profiler events (no GPU needed): kernel grouping, the
side-by-side diff, fused-op descriptions and finding a kernel's source in cache files."""

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))

import profile_diff as pd

EMBER = [
    {"name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "us": 50.0, "op": None},
    {"name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "us": 50.0, "op": None},
    {"name": "kernel3", "us": 30.0, "op": None},
    {"name": "kernel7", "us": 12.0, "op": None},
    {"name": "kernel3", "us": 30.0, "op": None},
    {"name": "pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>", "us": 20.0,
     "op": "aten::_scaled_dot_product_flash_attention"},
]  # fmt: skip
TORCH = [
    {"name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "us": 45.0, "op": None},
    {"name": "triton_poi_fused_add_gelu_0", "us": 10.0, "op": None},
    {"name": "triton_per_fused_native_layer_norm_1", "us": 8.0, "op": None},
    {"name": "triton_per_fused_native_layer_norm_3", "us": 8.0, "op": None},
    {"name": "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>",
     "us": 5.0, "op": "aten::add"},
    {"name": "pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>", "us": 20.0,
     "op": "aten::_scaled_dot_product_flash_attention"},
]  # fmt: skip


def test_kernel_keys_and_categories():
    assert pd.kernel_key("triton_per_fused_native_layer_norm_3") == (
        "triton_per_fused_native_layer_norm"
    )
    assert pd.kernel_key("void at::native::foo<4, bar>(int)") == "at::native::foo<...>"
    assert pd.category(EMBER[0]["name"]) == "matmul"
    assert pd.category("kernel3") == "Ember kernel"
    assert pd.category("kddced5fdbec9bd67") == "Ember kernel"  # named by its source hash
    assert pd.category(TORCH[1]["name"]) == "fused pointwise (Triton)"
    assert pd.category(TORCH[2]["name"]) == "fused reduction (Triton)"
    assert pd.category(EMBER[5]["name"], EMBER[5]["op"]) == "attention"
    assert pd.category("implicit_convolve_sgemm") == "convolution"
    assert pd.category("Memcpy DtoD (Device -> Device)") == "memcpy/memset"
    assert pd.category(TORCH[4]["name"], "aten::add") == "ATen elementwise"
    assert pd.category("mystery") == "other"


def test_group_and_side_by_side():
    groups = pd.group_events(TORCH, by="kernel")
    # two launches of one layer-norm kernel (different numeric suffixes) are one kernel
    assert groups["triton_per_fused_native_layer_norm"]["count"] == 2
    assert groups["triton_per_fused_native_layer_norm"]["us"] == pytest.approx(16.0)
    rows = {r["group"]: r for r in pd.side_by_side(EMBER, TORCH)}
    assert rows["matmul"]["ember_us"] == 100.0 and rows["matmul"]["torch_us"] == 45.0
    assert rows["matmul"]["diff_us"] == pytest.approx(55.0)
    assert rows["Ember kernel"]["ember_count"] == 3 and rows["Ember kernel"]["torch_count"] == 0
    assert rows["attention"]["diff_us"] == 0.0
    ordered = pd.side_by_side(EMBER, TORCH)
    assert ordered[0]["group"] == "Ember kernel"  # |72| us: the largest difference first
    assert sum(r["ember_us"] for r in ordered) == pytest.approx(sum(e["us"] for e in EMBER))
    assert pd.worst_kernels(EMBER, 2) == [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 100.0, 2),
        ("kernel3", 60.0, 2),
    ]


TRITON_SRC = '''import triton
import triton.language as tl

@triton.jit
def kernel3(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    x0 = xoffset + tl.arange(0, XBLOCK)
    v = tl.load(in_ptr0 + x0)
    r = tl.sum(tl.exp(v - tl.max(v, 0)), 0)
    tl.store(out_ptr0 + x0, r)


@triton.jit
def kernel7(in_ptr0, out_ptr0):
    pass
'''
CPP_SRC = """#include <cmath>
extern "C" void kernel9(const float* in0, float* out0, long n)
{
    for (long i = 0; i < n; ++i) { out0[i] = std::tanh(in0[i]); }
}
void other() {}
"""


def test_extract_source_and_fused_ops():
    src = pd.extract_source(TRITON_SRC, "kernel3")
    assert src.startswith("@triton.jit\ndef kernel3(") and "tl.store" in src
    assert "kernel7" not in src
    cpp = pd.extract_source(CPP_SRC, "kernel9")
    assert cpp.startswith('extern "C" void kernel9(') and cpp.endswith("}") and "other" not in cpp
    assert pd.extract_source(TRITON_SRC, "kernel99") is None
    assert pd.fused_ops("triton_poi_fused_add_gelu_0") == "pointwise: add, gelu"
    assert pd.fused_ops("kernel3", src) == "reduction: sum, exp, max"
    assert pd.fused_ops("kernel3") == ""


def test_find_sources_in_files_and_json_entries(tmp_path):
    (tmp_path / "ember").mkdir()
    header = json.dumps({"key": "abc", "format": 3})
    payload = json.dumps({"kernels": [{"name": "kernel3", "source": TRITON_SRC}], "pad": "x" * 100})
    (tmp_path / "ember" / "entry").write_text(header + "\n" + payload + "\n")
    (tmp_path / "inductor" / "ab").mkdir(parents=True)
    (tmp_path / "inductor" / "ab" / "k.py").write_text(
        "@triton.jit\ndef triton_poi_fused_add_gelu_0(x):\n    return x\n"
    )
    found = pd.find_sources(
        [tmp_path / "ember", tmp_path / "inductor"], ["kernel3", "triton_poi_fused_add_gelu_0"]
    )
    assert "tl.exp" in found["kernel3"]
    assert found["triton_poi_fused_add_gelu_0"].startswith("@triton.jit")


def test_render_markdown():
    text = pd.render("m", "infer-bf16", "cuda", EMBER, TORCH, {"kernel3": TRITON_SRC},
                     {"ember": 0.001, "torch_compile_cg": 0.002})  # fmt: skip
    assert "| **total** | 6 | **192.0** | 6 | **96.0** | **96.0** |" in text
    assert "## Where Ember spends more" in text and "- matmul: +55.0 us" in text
    assert "`triton_poi_fused_add_gelu` | 1 | 10.0 | pointwise: add, gelu |" in text
    worst = text.split("most expensive kernels")[1]
    assert worst.index("sm90_xmma") < worst.index("kernel3") and "tl.exp" in worst
    assert "(no generated source" in worst  # the cuBLAS kernel has none


@pytest.mark.slow  # two CPU compiles of a small MLP (a minute or more on two shared cores)
def test_script_end_to_end_on_cpu(tmp_path):
    import subprocess

    proc = subprocess.run(
        [sys.executable, str(BENCH / "profile_diff.py"), "mlp8_w256_b1", "--device", "cpu",
         "--mode", "infer-fp32", "--warmup", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    text = (tmp_path / "profile_diff.md").read_text()
    assert "| **total** |" in text and "## Where Ember spends more" in text
    events = json.loads((tmp_path / "events.json").read_text())
    assert events["ember"] and events["torch"]  # both sides profiled some CPU ops
    assert all(e["us"] >= 0 and e["name"] for side in events.values() for e in side)


def test_timeline_counts_the_span_and_the_time_no_kernel_ran():
    events = [{"name": "a", "us": 10.0, "start": 100.0, "end": 110.0},
              {"name": "b", "us": 10.0, "start": 105.0, "end": 115.0},  # overlaps a
              {"name": "c", "us": 5.0, "start": 125.0, "end": 130.0},
              {"name": "d", "us": 2.0, "start": 126.0, "end": 128.0}]  # inside c
    assert pd.timeline(events) == {"span_us": 30.0, "idle_us": 10.0}
    assert pd.timeline([{"name": "cpu op", "us": 3.0}]) is None
