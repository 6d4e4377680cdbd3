"""The converted-model cache: processes that convert the default model at once do not collide."""

from pathlib import Path

from spd.models.loading import _publish


def _folder(path: Path, text: str) -> Path:
    path.mkdir()
    (path / "config.json").write_text(text)
    return path


def test_a_conversion_moves_into_place(tmp_path):
    out = tmp_path / "model"
    _publish(_folder(tmp_path / "model.partial-a", "a"), out)
    assert (out / "config.json").read_text() == "a"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_a_second_conversion_keeps_the_first_and_removes_its_own(tmp_path):
    out = tmp_path / "model"
    _publish(_folder(tmp_path / "model.partial-a", "a"), out)
    _publish(_folder(tmp_path / "model.partial-b", "b"), out)
    assert (out / "config.json").read_text() == "a"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
