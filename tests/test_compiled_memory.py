"""A compiled model keeps no activations of the call it was compiled on."""

import gc

import pytest
import torch

import ember


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compiled_graph_holds_no_activations(backend):
    """After compiling, nothing but the parameters and the caller's input stays alive: the values
    the interpreter and tracers computed on the example call are dropped (else a compiled model
    pins a whole call's activations, several times eager's peak memory on a GPU)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(5)])
    x = torch.randn(256, 128)
    compiled = ember.compile(m, backend=backend)
    with torch.no_grad():
        out = compiled(x)
        torch.testing.assert_close(out, m(x))
    del out
    gc.collect()
    keep = {id(p) for p in m.parameters()} | {id(x)}
    big = [o for o in gc.get_objects()
           if isinstance(o, torch.Tensor) and id(o) not in keep and o.numel() >= x.numel()]  # fmt: skip
    assert big == [], [tuple(t.shape) for t in big]
