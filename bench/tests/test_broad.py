"""The gpu-broad suite's contract on the CPU: 60+ models with family tags covering the families
the race needs, gpu-core inside it (and as --core), configs that construct, a smoke forward of a
few new models, and a report that leads with Ember against torch.compile's CUDA graphs.
"""

import inspect
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))

import check_models
import models
import models_broad
import report
import run
import suites

BROAD = suites.SUITES["gpu-broad"]
# The families the race must cover (the list); each needs at least one model.
REQUIRED = {
    "cnn-plain", "cnn-grouped", "cnn-depthwise", "cnn-dense", "cnn-multibranch", "vit-absolute",
    "vit-relative", "vit-windowed", "mlp-only", "hybrid", "text-encoder",
    "text-encoder-disentangled", "text-encoder-bottleneck", "text-decoder-rotary",
    "text-decoder-alibi", "text-decoder-gqa", "text-decoder-sliding", "text-encoder-decoder",
    "speech-encoder",
}  # fmt: skip


def test_broad_suite_has_60_models_with_families():
    assert len(BROAD.models) >= 60 and len(set(BROAD.models)) == len(BROAD.models)
    assert BROAD.modes[:2] == ("infer-bf16", "infer-fp32")
    assert "torch_compile_cg" in BROAD.backends
    families = {}
    for name in BROAD.models:
        spec = models.MODELS[name]
        assert spec.family in models_broad.FAMILIES, (name, spec.family)
        families.setdefault(spec.family, []).append(name)
    assert REQUIRED <= set(families), REQUIRED - set(families)
    # the parts split every mode's models into pieces that each get some of them
    for mode in BROAD.modes:
        n = BROAD.parts[mode]
        assert sum(len(suites.part_of(BROAD.models, f"{i}/{n}")) for i in range(1, n + 1)) == len(
            BROAD.models
        )


def test_core_is_inside_broad_and_selectable(tmp_path):
    assert set(suites.GPU_CORE) <= set(BROAD.models)
    assert BROAD.subsets["core"] == suites.GPU_CORE
    plan = run._plan("gpu-broad", run.Options(subset="core", device="cpu"), lambda *a: None)
    assert plan["part_models"] == list(suites.GPU_CORE)
    core = run._plan("gpu-core", run.Options(subset="core", device="cpu"), lambda *a: None)
    assert core["part_models"] == list(suites.GPU_CORE)
    with pytest.raises(SystemExit, match="no subset"):
        run._plan("cpu-core", run.Options(subset="core", device="cpu"), lambda *a: None)
    assert run.parse_args(["--suite", "gpu-broad", "--core", "--out", "x"]).core
    # gpu-broad skips warm compiles unless asked; other suites keep them
    assert plan["cfg"]["warm_compile"] is False and core["cfg"]["warm_compile"] is True
    on = run._plan("gpu-broad", run.Options(warm_compile=True, device="cpu"), lambda *a: None)
    assert on["cfg"]["warm_compile"] is True


def test_list_prints_families(capsys):
    run.list_all()
    out = capsys.readouterr().out
    assert "families (gpu-broad):" in out
    for family in REQUIRED:
        assert f"  {family} (" in out
    assert "deberta-v3-base" in out.split("families (gpu-broad):")[1]


def _accepts(cls, model_cls, key):
    """Whether config class `cls` or its model's code knows field `key`: an unknown keyword would
    be stored silently as an attribute, hiding a typo or a field this transformers lacks (some
    models read optional fields with getattr, e.g. DeBERTa-v2's position_buckets)."""
    params = inspect.signature(cls.__init__).parameters
    if key in params or hasattr(cls, key) or key in getattr(cls, "attribute_map", {}):
        return True
    return key in inspect.getsource(sys.modules[model_cls.__module__])


def test_transformers_configs_construct_with_known_fields():
    transformers = pytest.importorskip("transformers")
    # reference_compile: ModernBERT's switch for its own torch.compile; newer releases dropped
    # it, and an unknown keyword is harmless there.
    tolerated = {"reference_compile"}
    for name, (model_cls, config_cls, vocab, _, _, _, config) in models_broad.HF.items():
        cls, model_cls = getattr(transformers, config_cls), getattr(transformers, model_cls)
        cfg = models._hf_config(config_cls, vocab_size=vocab, **config)
        assert cfg.vocab_size == vocab, name
        unknown = [k for k in config if k not in tolerated and not _accepts(cls, model_cls, k)]
        assert not unknown, (name, unknown)


def test_timm_names_exist():
    timm = pytest.importorskip("timm")
    for name, _, _ in models_broad.TIMM:
        assert timm.is_model(name), name


# Cheap builds covering some of the fiddlier new configs: grouped 1x1 convolutions, a
# sliding-window GQA decoder, ALiBi, and audio (check_models.py runs them all).
SMOKE = ("squeezebert-uncased", "mistral-4l-1024-swa", "bloom-12l-1024", "wav2vec2-base")


@pytest.mark.parametrize("name", SMOKE)
def test_smoke_forward(name):
    pytest.importorskip("transformers")
    status, detail = check_models.check(name, batch=1, seq=16)
    assert status == "ok", detail


def _run(records, backends):
    return {"suite": "gpu-broad", "mode": "infer-bf16", "device": "cuda", "part": None,
            "backends": backends, "models": sorted({r["model"] for r in records}),
            "suite_models": list(BROAD.models), "unit": "ms", "timing": "t",
            "records": records, "notes": [], "elapsed_s": 1.0}  # fmt: skip


def test_report_leads_with_reduce_overhead():
    backends = ["eager", "torch_compile_cg", "torch_compile", "ember"]
    lat = {"resnet50": {"eager": 4.0, "torch_compile_cg": 2.0, "torch_compile": 3.0, "ember": 1.0},
           "gpt2": {"eager": 4.0, "torch_compile_cg": 2.0, "torch_compile": 2.0, "ember": 4.0},
           "t5-small": {"eager": 4.0, "torch_compile_cg": 2.0, "torch_compile": 2.0}}  # fmt: skip
    records = [{"model": m, "backend": b, "status": "ok", "latency_ms": t}
               for m, row in lat.items() for b, t in row.items()]  # fmt: skip
    records.append({"model": "t5-small", "backend": "ember", "status": "failed", "error": "x"})
    run_ = _run(records, backends)
    summary = report.summarize(run_)
    lfl = summary["like_for_like"]
    # pairwise over the two models both passed: 2x and 0.5x -> 1x; t5-small is left out
    assert lfl["vs_cg"] == {"geomean": pytest.approx(1.0), "models": 2, "wins": 1}
    assert lfl["vs_torch"]["geomean"] == pytest.approx((3.0 * 0.5) ** 0.5)
    text = report.markdown([run_])
    summary_text = text.split("### Summary")[1]
    first = next(line for line in summary_text.splitlines() if line.strip())
    assert first.startswith("**ember vs torch.compile(mode=\"reduce-overhead\")")
    assert "1.00x geomean over the 2 models" in first and "vs default torch.compile" in first
    assert "like for like" in text.split("### Summary")[0]  # the header says so
    # the per-model like-for-like table comes before the speedups over eager
    assert text.index("### Ember vs torch.compile[reduce-overhead]") < text.index(
        "### Speedup over eager"
    )
    assert "| 1 | gpt2 | text-decoder | - | 4.000 ms | 2.000 ms | **0.50x** |" in text
    head = next(line for line in summary_text.splitlines() if line.startswith("| backend"))
    assert head.index("reduce-overhead") < head.index("geomean vs torch.compile |")


def test_report_without_reduce_overhead_is_unchanged():
    records = [{"model": "gpt2", "backend": b, "status": "ok", "latency_ms": 1.0}
               for b in ("eager", "torch_compile", "ember")]  # fmt: skip
    run_ = _run(records, ["eager", "torch_compile", "ember"])
    assert "like_for_like" not in report.summarize(run_)
    text = report.markdown([run_])
    assert "reduce-overhead" not in text and "### Speedup over eager" in text
