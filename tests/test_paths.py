"""Where benchmark data and caches are looked for: never a path derived from the checkout."""

from __future__ import annotations

from pathlib import Path

from elfreg.paths import cache_dir, data_dir


def test_data_dir_order_is_flag_then_variable_then_user_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ELFREG_DATA_DIR", str(tmp_path / "env-data"))
    monkeypatch.setenv("ELFREG_CACHE", str(tmp_path / "cache"))
    assert data_dir(tmp_path / "flag") == tmp_path / "flag"
    assert data_dir() == tmp_path / "env-data"
    monkeypatch.delenv("ELFREG_DATA_DIR")
    assert cache_dir() == tmp_path / "cache" and data_dir() == tmp_path / "cache" / "data"
    # the working directory does not matter, even one with a shared/data folder beside it
    (tmp_path / "shared" / "data").mkdir(parents=True)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert data_dir() == tmp_path / "cache" / "data"
    monkeypatch.delenv("ELFREG_CACHE")
    assert data_dir() == Path.home() / ".cache" / "elfreg" / "data"
