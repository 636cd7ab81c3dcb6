"""A KV cache updated in place by the compiled program (inductor/input_updates.py): a module whose
buffers a step writes a few rows of (`index_copy_`, indexed assignment) runs with no copy of a
whole cache: the index_put writes into the buffer itself and the runtime copies nothing back.

Cross-component: aot_autograd names the outputs that are inputs' new values
(INPUT_UPDATES_META_KEY) and skips a copy onto the same memory; inductor marks the index_puts,
lowers them in place and keeps the output a view. Programs that also read the old value, or
accumulate, keep the functional path; every case matches eager step after step.
"""

import torch

import ember
from input_updates_model import Cache, _steps
from input_updates_model import in_place_calls  # noqa: F401  (a fixture)


def test_cache_rows_are_written_in_place_with_no_copy(in_place_calls):
    copies, kept = _steps(Cache())
    assert kept
    assert copies == 0  # neither the index_put's copy of the cache nor the runtime's copy back
    assert in_place_calls and all(in_place_calls)


def test_a_program_reading_the_old_value_keeps_the_functional_write(in_place_calls):
    copies, kept = _steps(Cache(read_old=True))
    assert kept
    assert copies >= 1  # the k cache's functional write (a copy of it), copied back
    assert in_place_calls[:2] == [False, True]  # v is still written in place


def test_an_accumulating_write_keeps_the_functional_write(in_place_calls):
    copies, _ = _steps(Cache(accumulate=True))
    assert copies >= 1  # v's accumulation is copied back
    assert in_place_calls[:2] == [True, False]  # k is still written in place


def test_the_switch_turns_it_off(in_place_calls, monkeypatch):
    from ember.inductor.config import config

    monkeypatch.setattr(config, "inplace_input_updates", False)
    copies, _ = _steps(Cache())
    assert copies >= 2 and not any(in_place_calls)  # each cache at least copied back


class _Projected(Cache):
    """Cache behind a Linear of two rows (a matrix product rewritten as a reduction)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, new, pos):
        return super().forward(self.proj(new.view(2, 4)).view(1, 2, 1, 4), pos)


def test_the_write_stays_in_place_where_small_matmuls_become_reductions(in_place_calls,
                                                                        monkeypatch):
    """Rewriting a product of few rows as a reduction (CUDA's default at batch 1) copies the
    graph, which once lost the record of its input updates: every step then copied each cache
    twice."""
    from ember.inductor.config import config

    monkeypatch.setattr(config, "small_mm_as_reduction", True)
    torch.manual_seed(0)
    copies, kept = _steps(_Projected())
    assert kept and copies == 0
    assert in_place_calls and all(in_place_calls)
