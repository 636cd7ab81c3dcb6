"""A model whose graph keeps scans and sorting as extern ops (cumsum position ids, a top-k head,
a sort whose indices nobody reads) exported, packaged for the CPU and run by the C++ runtime,
against eager."""

import torch

import ember
from ember.cpp_wrapper import load_package, package
from ember.inductor import compile_prims


class Ranker(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x, mask):
        positions = mask.cumsum(-1) - 1  # int64 position ids from an attention mask
        h = self.fc(x + positions.unsqueeze(-1).float())
        scores, labels = torch.topk(h.softmax(-1), 3)
        ranked = torch.sort(h, dim=1, descending=True).values
        return scores, labels, ranked, torch.cummax(h, dim=-1).indices


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 5, 8, generator=g), torch.randint(0, 2, (2, 5), generator=g)


def test_scans_and_sorts_run_in_a_package(tmp_path):
    torch.manual_seed(0)
    model = Ranker().eval()
    exported = ember.export(model, _inputs(0))
    artifact = compile_prims(exported.graph_module, exported.example_inputs()).artifact
    externs = {s.target for s in artifact.steps if s.kind == "extern"}
    assert {"extern.cumsum", "extern.topk", "extern.sort", "extern.cummax"} <= externs, externs
    path = package(exported, tmp_path / "pkg", device="cpu")
    x, mask = _inputs(1)
    got = load_package(path)(x, mask)
    with torch.no_grad():
        want = model(x, mask)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
