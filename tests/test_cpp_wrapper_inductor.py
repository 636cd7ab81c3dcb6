"""Models compiled by ember.inductor, run by the C++ wrapper in process and from AOT packages.

An integration test: it imports ember.inductor (product code of cpp_wrapper never does) to get
real artifacts. The module's parameters are inputs of the traced graph; packaging freezes them.
"""

import subprocess

import numpy as np
import pytest
import torch
import torch.fx as fx

from ember.cpp_wrapper import install_run_package, load_artifact, load_package, package

import ember.inductor as inductor  # noqa: E402
import ember.aot_autograd as aot_autograd  # noqa: E402


def compile_to_artifact(model: torch.nn.Module, x: torch.Tensor):
    """The forward artifact inductor makes for `model` at `x`, and its kernels' include dir."""
    from ember.inductor import runtime

    graphs = []

    def forward_compiler(gm, example_inputs):
        compiled = inductor.compile_prims(gm, example_inputs)
        graphs.append(compiled)
        return compiled

    with torch.no_grad():
        fn = aot_autograd.aot_module_simplified(
            fx.symbolic_trace(model),
            [x],
            fw_compiler=forward_compiler,
            bw_compiler=forward_compiler,
        )
        fn(x)
    assert graphs, "inductor compiled no graph"
    return graphs[0].artifact, [str(runtime.CSRC)]


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 32),
            torch.nn.ReLU(),
            torch.nn.Linear(32, 16),
            torch.nn.Tanh(),
            torch.nn.Linear(16, 4),
        )

    def forward(self, x):
        return self.net(x)


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, stride=2, groups=2)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        x = torch.relu(self.c1(x))
        x = torch.nn.functional.max_pool2d(x, 2)
        x = torch.relu(self.c2(x))
        return self.fc(x.mean((2, 3)))


@pytest.fixture(scope="module")
def run_package(tmp_path_factory):
    return install_run_package(tmp_path_factory.mktemp("bin"))


@pytest.mark.parametrize("make, shape", [(MLP, (5, 8)), (CNN, (2, 3, 16, 16))], ids=["mlp", "cnn"])
def test_inductor_model_in_process_and_packaged(make, shape, run_package, tmp_path):
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(shape)
    artifact, include_dirs = compile_to_artifact(model, x)
    params = [p.detach() for p in model.parameters()]
    want = model(x).detach()

    in_process = load_artifact(artifact, include_dirs=include_dirs)
    torch.testing.assert_close(in_process(*params, x)[0], want, atol=1e-4, rtol=1e-4)

    weights = dict(zip(artifact.inputs, params))  # the parameters come first in the graph
    path = package(artifact, tmp_path / "pkg", constants=weights, include_dirs=include_dirs)
    torch.testing.assert_close(load_package(path)(x)[0], want, atol=1e-4, rtol=1e-4)

    np.save(tmp_path / "x.npy", x.numpy())
    r = subprocess.run(
        [str(run_package), str(path), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    torch.testing.assert_close(
        torch.from_numpy(np.load(tmp_path / "y.npy")), want, atol=1e-4, rtol=1e-4
    )


@pytest.mark.parametrize("bias", [True, False], ids=["addmm", "mm"])
def test_padded_linear_runs_in_process(bias, monkeypatch):
    # config.pad_mm (forced on, on CPU): the extern multiplies a zero-padded (1004-column) weight
    # into an aligned product that a kernel reads back through the view of its first 1001.
    monkeypatch.setattr(inductor.config, "pad_mm", True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1001, bias=bias), torch.nn.ReLU()).eval()
    x = torch.randn(64, 512)
    artifact, include_dirs = compile_to_artifact(model, x)
    assert any(tuple(b.meta.sizes) == (64, 1004) for b in artifact.buffers)
    params = [p.detach() for p in model.parameters()]
    got = load_artifact(artifact, include_dirs=include_dirs)(*params, x)[0]
    torch.testing.assert_close(got, model(x).detach(), atol=1e-4, rtol=1e-4)
    assert got.stride() == (1001, 1)
