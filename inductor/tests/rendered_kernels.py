"""Every Triton kernel the compiles of a test render (`pipeline.render_kernels`), by source: for
tests that also compile them for sm_90 with Triton's real compiler (`triton_aot.check_kernels`,
which rejects more programs than the interpreter runs)."""

import pytest


@pytest.fixture
def rendered_kernels(monkeypatch) -> dict:
    """source -> (kernel name, rendered source), filled as the test compiles."""
    from ember.inductor import pipeline

    seen, render = {}, pipeline.render_kernels

    def collect(*args, **kwargs):
        out = render(*args, **kwargs)
        seen.update({src.source: (name, src) for name, src in out.items()})
        return out

    monkeypatch.setattr(pipeline, "render_kernels", collect)
    return seen
