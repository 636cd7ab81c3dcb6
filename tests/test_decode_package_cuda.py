"""The done-when of decode-step packages on a GPU: a Llama-style decoder (decode_model.py's,
with room for 64 new tokens) packaged for CUDA, its caches updated in place by the runtime's
driver copies, and `ember_generate` standalone (`run_package --generate`) and in process giving
the eager greedy tokens. Skipped without CUDA.
"""

import json
import subprocess

import numpy as np
import pytest
import torch

import ember.cpp_wrapper as cw
from decode_model import LAYERS, Decoder, eager_greedy, zero_caches

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

NEW, PROMPT, LENGTH = 64, torch.tensor([[5, 17, 99, 3]]), 72


def test_generate_on_cuda_gives_the_eager_greedy_tokens(tmp_path):
    torch.manual_seed(0)
    model = Decoder(max_len=LENGTH).eval().cuda()
    example = (torch.tensor([[1]], device="cuda"), torch.tensor([0], device="cuda"),
               *zero_caches(1, LENGTH, "cuda"))  # fmt: skip
    path = cw.package_decode_step(model, example, tmp_path / "pkg", tokens=0, positions=1,
                                  caches=range(2, 2 + 2 * LAYERS), device="cuda")  # fmt: skip
    want, _ = eager_greedy(model, PROMPT, NEW, LENGTH, "cuda")
    got = cw.generate(cw.load_package(path), PROMPT, NEW)
    assert got.tolist() == want.tolist()
    run_package = cw.install_run_package(tmp_path / "bin/")
    np.save(tmp_path / "prompt.npy", PROMPT.numpy())
    run = subprocess.run([str(run_package), "--generate", str(NEW), str(path),
                          str(tmp_path / "prompt.npy"), str(tmp_path / "out.npy")],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert np.load(tmp_path / "out.npy").tolist() == want.tolist()


@pytest.fixture(scope="module")
def prefill(tmp_path_factory):
    """(model, a CUDA package of its step taking 1 to 8 new tokens)."""
    torch.manual_seed(0)
    model = Decoder(max_len=LENGTH).eval().cuda()
    example = (torch.tensor([[1]], device="cuda"), torch.tensor([0], device="cuda"),
               *zero_caches(1, LENGTH, "cuda"))  # fmt: skip
    path = cw.package_decode_step(model, example, tmp_path_factory.mktemp("prefill") / "pkg",
                                  tokens=0, positions=1, caches=range(2, 2 + 2 * LAYERS),
                                  max_new_tokens=8, device="cuda")  # fmt: skip
    return model, path


def test_a_prefill_step_on_cuda_runs_the_prompt_in_one_call(prefill):
    """max_new_tokens > 1: the tokens' length is dynamic; ember_generate runs the prompt in one
    call, then one token per call, and gives eager's greedy tokens."""
    model, path = prefill
    loaded = cw.load_package(path)
    for prompt in (PROMPT, torch.tensor([[7]]), torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])):
        want, _ = eager_greedy(model, prompt, 16, LENGTH, "cuda")
        before = cw.run_count(loaded)
        assert cw.generate(loaded, prompt, 16).tolist() == want.tolist()
        assert cw.run_count(loaded) - before == 16  # the prompt in one call, then 15 tokens


def test_generate_replays_its_one_token_steps_as_a_cuda_graph(prefill, monkeypatch, capfd):
    """With graphs (the default) the prefill and the first one-token step run plainly, the
    second is captured and every later one relaunched: a fraction of the plain run's kernel
    launches, the same tokens, the same run count."""
    from torch.profiler import ProfilerActivity, profile

    model, path = prefill
    loaded = cw.load_package(path)
    want, _ = eager_greedy(model, PROMPT, 16, LENGTH, "cuda")

    def launches(graphs: str):
        monkeypatch.setenv("EMBER_GENERATE_GRAPHS", graphs)
        before = cw.run_count(loaded)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            got = cw.generate(loaded, PROMPT, 16)
        assert got.tolist() == want.tolist()
        assert cw.run_count(loaded) - before == 16
        # kernel launches the host made (the profiler leaves out the driver's cuGraphLaunch)
        return sum("LaunchKernel" in e.name for e in prof.events())

    plain = launches("0")
    graphed = launches("verbose")
    said = capfd.readouterr().err
    assert "one-token steps replay a CUDA graph" in said, said
    assert 3 * graphed < plain, (graphed, plain)


def test_greedy_tokens_are_chosen_on_the_gpu_with_no_copy_back_per_token(prefill, monkeypatch):
    """The package carries ember_greedy: every new token, the first (from the prompt's logits)
    too, is chosen on the GPU and all are read back once (one device-to-host copy in all); with
    EMBER_GENERATE_GREEDY=host, one copy of the logits per token. Same tokens."""
    from torch.profiler import ProfilerActivity, profile

    model, path = prefill
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["decode"]["greedy_kernel"].startswith("ember_greedy_")
    loaded = cw.load_package(path)
    want, _ = eager_greedy(model, PROMPT, 16, LENGTH, "cuda")

    def copies_back(where: str):
        monkeypatch.setenv("EMBER_GENERATE_GREEDY", where)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            got = cw.generate(loaded, PROMPT, 16)
        assert got.tolist() == want.tolist()
        return sum("Memcpy DtoH" in e.name for e in prof.events())

    assert copies_back("device") == 1
    assert copies_back("host") >= 16


@pytest.mark.parametrize("length", [1, 8, 9, 11])
def test_greedy_on_the_gpu_from_prompts_of_one_token_one_chunk_and_two(prefill, length):
    """The first token chosen on the GPU by the kernel after a one-token prompt's run (plain in
    the first call, a replay of the session's graph in the second), from a whole chunk's last
    row, after a chunk and one token (8 + 1), and after two chunks (8 + 3): eager's tokens."""
    model, path = prefill
    prompt = torch.randint(0, 100, (1, length), generator=torch.Generator().manual_seed(length))
    want, _ = eager_greedy(model, prompt, 12, LENGTH, "cuda")
    loaded = cw.load_package(path)
    for _ in range(2):  # the second call's session holds the graph the first one captured
        assert cw.generate(loaded, prompt, 12).tolist() == want.tolist()


def test_calls_from_threads_each_get_a_session_and_the_eager_tokens(prefill):
    """Concurrent calls on one loaded package: each runs in a session of its own (its stream,
    caches and graph), kept by the model for later calls; every call gives eager's tokens."""
    from concurrent.futures import ThreadPoolExecutor

    model, path = prefill
    loaded = cw.load_package(path)
    prompts = [torch.tensor([[5, 17, 99, 3]]), torch.tensor([[7]]), torch.tensor([[2, 4, 6]])]
    wants = [eager_greedy(model, p, 12, LENGTH, "cuda")[0].tolist() for p in prompts]

    def worker(i):
        for j in range(3):
            k = (i + j) % len(prompts)
            got = cw.generate(loaded, prompts[k], 12).tolist()
            assert got == wants[k], (i, j, got, wants[k])

    with ThreadPoolExecutor(4) as pool:  # (a worker's failure is raised here)
        list(pool.map(worker, range(4)))
