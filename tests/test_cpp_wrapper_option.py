"""ember.compile(..., options={"cpp_wrapper": True}): the generated C++ wrapper runs in process."""

import torch

import ember
import ember.dynamo


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
            torch.nn.LayerNorm(64), torch.nn.Linear(64, 8),
        )  # fmt: skip

    def forward(self, x):
        return self.layers(x).softmax(-1)


def test_cpp_wrapper_matches_python_wrapper_in_inference():
    torch.manual_seed(0)
    model, x = MLP().eval(), torch.randn(16, 32)
    ember.dynamo.reset()
    with torch.no_grad():
        python_out = ember.compile(model)(x)
        ember.dynamo.reset()
        cpp_out = ember.compile(model, options={"cpp_wrapper": True})(x)
        expected = model(x)
    torch.testing.assert_close(cpp_out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cpp_out, python_out, rtol=1e-5, atol=1e-5)


def test_cpp_wrapper_trains():
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(16, 32)
    reference = MLP()
    reference.load_state_dict(model.state_dict())
    ember.dynamo.reset()
    compiled = ember.compile(model, options={"cpp_wrapper": True})
    compiled(x).square().sum().backward()
    reference(x).square().sum().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


def test_unknown_option_is_an_error():
    ember.dynamo.reset()
    def fn(x):
        return torch.sin(x) + 1

    compiled = ember.compile(fn, options={"no_such_option": 1})
    try:
        compiled(torch.randn(3))
    except Exception as e:  # the backend's TypeError, possibly wrapped by dynamo
        assert "no_such_option" in str(e)
    else:
        raise AssertionError("an unknown option was accepted")


def test_no_native_object_outlives_the_interpreter(tmp_path):
    """A process that ran the C++ wrapper exits with no nanobind leak report: the compiled entries
    (which own the native models) are released at exit, before their extension is torn down."""
    import os
    import subprocess
    import sys

    script = tmp_path / "run_once.py"
    script.write_text(
        "import torch, ember\n"
        "m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU())\n"
        "c = ember.compile(m, options={'cpp_wrapper': True})\n"
        "x = torch.randn(4, 16)\n"
        "torch.testing.assert_close(c(x), m(x))\n"
        "with torch.no_grad():\n"
        "    torch.testing.assert_close(c(x), m(x))\n"
        "print('ran')\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ran" in r.stdout
    assert "leaked" not in r.stderr, r.stderr[-3000:]
