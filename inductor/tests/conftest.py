"""Inductor tests: graph cache off (tests see every compile stage), counters reset per test."""

import os

import torch

# Triton reads TRITON_INTERPRET when it is first imported, and op_db (collected before the Triton
# tests) imports it: without a GPU, Triton kernels can only run in its interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from ember.inductor import config, metrics  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_inductor_state():
    saved = (config.cache, config.cpu_backend)
    config.cache = False
    metrics.reset()
    yield
    config.cache, config.cpu_backend = saved
