"""The ember_server example: 200 requests from 8 client threads, each answer checked against eager.

An MLP and a small CNN (float32, dynamic batch) are exported and packaged for the CPU; the server
(Bazel's build beside this file, else built through the compiler driver) serves them from 4
workers while 8 threads send requests of different batch sizes and malformed ones in between.
"""

import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import ember
from ember.cpp_wrapper import package

from build_server import build_server

TOL = dict(atol=1e-4, rtol=1e-4)
CLIENTS, REQUESTS = 8, 200
MIN_BATCH, MAX_BATCH = 2, 16


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16), torch.nn.Tanh(),
            torch.nn.Linear(16, 4),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(x.flatten(1))


MODELS = {"mlp": (MLP, (8,)), "cnn": (CNN, (3, 8, 8))}


@pytest.fixture(scope="module")
def server_program():
    bazel_built = Path(__file__).with_name("ember_server")  # a data dependency under Bazel
    return bazel_built if bazel_built.exists() else build_server()


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """name -> (model, input features, package dir), each exported and packaged once."""
    made = {}

    def get(name):
        if name not in made:
            cls, features = MODELS[name]
            torch.manual_seed(0)
            model = cls().eval()
            batch = ember.export.Dim("batch", min=MIN_BATCH, max=MAX_BATCH)
            example = (torch.randn(4, *features),)
            exported = ember.export(model, example, dynamic_shapes={"x": {0: batch}})
            made[name] = model, features, package(exported, tmp_path_factory.mktemp(name) / "pkg")
        return made[name]

    return get


class Server:
    """The server as a subprocess: send() writes one request line, answers are read by a thread."""

    def __init__(self, program, package_dir, *flags):
        # One OpenMP thread per worker: the workers are the parallelism (2 cores here).
        env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
        self.proc = subprocess.Popen(
            [str(program), "--threads", "4", *flags, str(package_dir)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1, env=env,
        )  # fmt: skip
        ready = self.proc.stdout.readline().split()
        assert ready == ["ready", "1", "1", "4"], (ready, self.proc.stderr.read())
        self.lock, self.answers, self.events = threading.Lock(), {}, {}
        self.reader = threading.Thread(target=self._read)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            rid, _, text = line.rstrip("\n").partition(" ")
            self.answers[rid] = text
            self.events[rid].set()

    def request(self, rid, *paths, timeout=60):
        """Send `rid paths...` and wait for its answer ("ok" or "error STATUS: message")."""
        with self.lock:
            self.events[rid] = threading.Event()
            self.proc.stdin.write(" ".join([rid, *map(str, paths)]) + "\n")
            self.proc.stdin.flush()
        assert self.events[rid].wait(timeout), f"no answer to {rid}"
        return self.answers[rid]

    def close(self):
        self.proc.stdin.close()
        rc = self.proc.wait(timeout=60)
        self.reader.join()
        return rc, self.proc.stderr.read()


def _malformed(tmp, features):
    """(request paths, status, text): requests the server must refuse, saying why."""
    np.save(tmp / "wide.npy", np.zeros((3, *features[:-1], features[-1] + 1), np.float32))
    np.save(tmp / "f64.npy", np.zeros((3, *features)))
    np.save(tmp / "huge_batch.npy", np.zeros((MAX_BATCH + 1, *features), np.float32))
    (tmp / "garbage.npy").write_bytes(b"not a numpy file")
    out = tmp / "never.npy"
    return [
        ((tmp / "garbage.npy", out), "EMBER_ERR_INVALID_ARGUMENT", "not a .npy file"),
        ((tmp / "missing.npy", out), "EMBER_ERR_INVALID_ARGUMENT", "cannot open"),
        ((tmp / "wide.npy",), "EMBER_ERR_INVALID_ARGUMENT", "expected 1 input and 1 output"),
        ((tmp / "wide.npy", out), "EMBER_ERR_SHAPE", "size of dimension"),
        ((tmp / "f64.npy", out), "EMBER_ERR_DTYPE", "expected float32, got float64"),
        ((tmp / "huge_batch.npy", out), "EMBER_ERR_GUARD", "outside its range"),
    ]


# A model per worker is the same code path but for the load: run on the MLP only, to stay fast.
@pytest.mark.parametrize(
    "name, mode", [("mlp", "shared"), ("cnn", "shared"), ("mlp", "per_worker")]
)
def test_server_answers_concurrent_requests_and_survives_bad_ones(
    server_program, packages, name, mode, tmp_path
):
    model, features, path = packages(name)
    server = Server(server_program, path, *(["--model-per-worker"] if mode == "per_worker" else []))
    gen = torch.Generator().manual_seed(1)
    inputs = []
    for i in range(REQUESTS):  # distinct inputs of varying batch: a mixed-up answer shows
        batch = int(torch.randint(MIN_BATCH, MAX_BATCH + 1, (), generator=gen))
        x = torch.randn(batch, *features, generator=gen)
        np.save(tmp_path / f"in{i}.npy", x.numpy())
        inputs.append(x)
    bad = _malformed(tmp_path, features)
    answers, bad_answers, errors = {}, [], []

    def client(c):
        try:
            for n, i in enumerate(range(c, REQUESTS, CLIENTS)):
                if n == 10:  # one malformed request per client, amid the good ones
                    k = c % len(bad)
                    bad_answers.append((k, server.request(f"bad{c}", *bad[k][0])))
                answers[i] = server.request(f"req{i}", tmp_path / f"in{i}.npy",
                                            tmp_path / f"out{i}.npy")  # fmt: skip
        except BaseException as e:  # surfaced below: a client must not fail silently
            errors.append(e)

    clients = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
    for t in clients:
        t.start()
    for t in clients:
        t.join()
    for k, (paths, _, _) in enumerate(bad):  # every kind once more, then a good one still works
        bad_answers.append((k, server.request(f"late{k}", *paths)))
    last = server.request("last", tmp_path / "in0.npy", tmp_path / "last.npy")
    rc, stderr = server.close()
    assert not errors, errors
    assert rc == 0, stderr
    assert sorted(answers) == list(range(REQUESTS))
    assert all(a == "ok" for a in answers.values()), sorted(set(answers.values()))
    with torch.no_grad():
        for i, x in enumerate(inputs):
            got = torch.from_numpy(np.load(tmp_path / f"out{i}.npy"))
            torch.testing.assert_close(got, model(x), **TOL, msg=lambda m: f"request {i}: {m}")
    for k, answer in bad_answers:
        paths, status, text = bad[k]
        assert answer.startswith(f"error {status}: ") and text in answer, (paths, answer)
    assert not (tmp_path / "never.npy").exists()
    assert last == "ok" and np.array_equal(np.load(tmp_path / "last.npy"),
                                           np.load(tmp_path / "out0.npy"))  # fmt: skip
    served, failed = REQUESTS + 1, CLIENTS + len(bad)
    assert f"{served} requests served, {failed} failed, 4 workers" in stderr, stderr


def test_server_refuses_a_damaged_package(server_program, packages, tmp_path):
    """Loading fails with the runtime's status and message; nothing is served."""
    damaged = tmp_path / "pkg"
    damaged.mkdir()
    for f in packages("mlp")[2].iterdir():
        (damaged / f.name).write_bytes(f.read_bytes())
    weights = damaged / "weights.bin"
    weights.write_bytes(weights.read_bytes()[:-1])
    r = subprocess.run([str(server_program), str(damaged)], input="", capture_output=True,
                       text=True)  # fmt: skip
    assert r.returncode == 6 and "EMBER_ERR_PACKAGE" in r.stderr and r.stdout == "", r
