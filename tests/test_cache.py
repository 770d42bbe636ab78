"""The cache folder and what is kept there: where it lives, whole-file writes, ScienceWorld gold paths
generated once and read back (the generator is counted, not run: no JVM needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rir_runtime.cache import cache_dir, write_atomic


def test_cache_dir_prefers_the_argument_then_the_environment(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("RIR_CACHE_DIR", str(tmp_path / "env"))
    assert cache_dir("models") == tmp_path / "env" / "models"
    assert cache_dir("textworld", root=tmp_path / "arg") == tmp_path / "arg" / "textworld"
    monkeypatch.delenv("RIR_CACHE_DIR")
    assert cache_dir() == Path.home() / ".cache" / "rir"


def test_write_atomic_replaces_whole_files_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b.json"
    write_atomic(path, "[1]")
    write_atomic(path, "[2, 3]")
    assert path.read_text() == "[2, 3]"
    assert [p.name for p in path.parent.iterdir()] == ["b.json"]


def test_gold_paths_are_generated_once_and_a_corrupt_entry_again(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("scienceworld")
    from rir_runtime.envs import scienceworld_env

    monkeypatch.setenv("RIR_CACHE_DIR", str(tmp_path))
    made: list[tuple[str, int, str]] = []

    def fake_apart(task: str, variation_id: int, simplification: str) -> tuple[str, ...]:
        made.append((task, variation_id, simplification))
        return ("look around", f"focus on thing {variation_id}")

    monkeypatch.setattr(scienceworld_env, "gold_path_apart", fake_apart)
    first = scienceworld_env.gold_path("boil", 3, "easy")
    assert scienceworld_env.gold_path("boil", 3, "easy") == first == ("look around", "focus on thing 3")
    assert made == [("boil", 3, "easy")]  # the second read came from disk

    scienceworld_env.gold_path("boil", 4, "easy")
    assert len(made) == 2  # another variation is another entry
    (entry,) = tmp_path.rglob("3.json")
    entry.write_text('["look around", ')  # a write cut short by hand
    assert scienceworld_env.gold_path("boil", 3, "easy") == first
    assert len(made) == 3 and entry.read_text() == '["look around", "focus on thing 3"]'
