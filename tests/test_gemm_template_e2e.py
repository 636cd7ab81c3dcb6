"""max-autotune's matmul templates end to end on CUDA (skipped without it): ember.compile with
the Python wrapper and with the C++ wrapper (which launches the templates' cubins)."""

import pytest
import torch

import ember
import ember.dynamo
from ember.inductor import config, metrics

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)
    ).cuda().eval()  # fmt: skip


@pytest.mark.parametrize("cpp_wrapper", [False, True])
def test_forced_templates_through_ember_compile(cpp_wrapper, monkeypatch, tmp_path):
    from ember.ir import toolchain

    monkeypatch.setattr(toolchain.config, "cache_dir", tmp_path)  # compiled here, not a cache hit
    monkeypatch.setattr(config, "gemm_force", 0)
    model, x = _model(), torch.randn(128, 256, device="cuda")
    ember.dynamo.reset()
    metrics.reset()
    options = {"cpp_wrapper": True} if cpp_wrapper else None
    with torch.no_grad():
        out = ember.compile(model, mode="max-autotune-no-cudagraphs", options=options)(x)
        torch.testing.assert_close(out, model(x), atol=1e-4, rtol=1e-4)
    assert metrics.gemm_templates == 2


def test_measured_choice_under_autocast(tmp_path, monkeypatch):
    """bf16 autocast: the weights' casts are prologue candidates; whatever the timing picks
    computes what eager computes."""
    from ember.ir import toolchain

    monkeypatch.setattr(toolchain.config, "cache_dir", tmp_path)
    model, x = _model(), torch.randn(1024, 256, device="cuda")
    ember.dynamo.reset()
    metrics.reset()
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        out = ember.compile(model, mode="max-autotune")(x)
        expected = model(x)
    torch.testing.assert_close(out.float(), expected.float(), atol=3e-2, rtol=2e-2)
    assert metrics.gemm_autotune_runs == 2
    _assert_templates_were_timed(tmp_path, 2)


def _assert_templates_were_timed(cache_root, count):
    """The choice cache holds `count` entries, in each of which the library call and at least
    one template ran (a worker that failed outright would leave the library call unmeasured)."""
    import json

    entries = sorted((cache_root / "inductor" / "gemm_autotune").glob("*.json"))
    assert len(entries) == count
    for path in entries:
        times = json.loads(path.read_text())["times"]
        assert times["extern"] is not None, times
        assert any(t is not None for label, t in times.items() if label != "extern"), times
