"""cache_files.content_file: a content-addressed source file, rewritten only when damaged."""

import logging
from pathlib import Path

from ember.ir import cache_files


def test_a_file_published_by_another_process_meanwhile_is_not_damaged(
    tmp_path, monkeypatch, caplog
):
    """Eight processes filling one empty cache: one process's read finds the file missing,
    another publishes it before the first looks again. Only what the read saw may be called
    damaged (the check used to look at the path a second time and warn)."""
    path = tmp_path / "triton" / "k_1.py"
    path.parent.mkdir()
    path.write_text("source")
    real = Path.read_bytes
    calls = []

    def missing_once(self):
        calls.append(self)
        if len(calls) == 1:
            raise FileNotFoundError(self)  # not there yet when this process read it
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", missing_once)
    with caplog.at_level(logging.WARNING):
        assert cache_files.content_file(path, "source") == path
    assert not [r for r in caplog.records if "damaged" in r.getMessage()]
    assert path.read_text() == "source"


def test_a_damaged_file_is_rewritten_with_one_warning(tmp_path, caplog):
    path = tmp_path / "k_2.py"
    path.write_text("sourcX")
    with caplog.at_level(logging.WARNING):
        assert cache_files.content_file(path, "source") == path
    assert path.read_text() == "source"
    assert [r for r in caplog.records if "damaged" in r.getMessage()]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        cache_files.content_file(path, "source")
    assert not caplog.records
