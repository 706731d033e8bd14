"""The toy LMs elfreg ships: the default build is used from the package without building, every
file is checked, ``ELFREG_TOY_LMS=build`` builds here instead, and the wheel carries the files."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_toy_assets import BUILD
from transformers import AutoModelForCausalLM

from elfreg.toy import assets as toy_assets
from elfreg.toy import shipped
from elfreg.toy.registry import resolve_toy_id

ROOT = Path(__file__).resolve().parents[2]


class TriedToBuild(Exception):
    pass


def _no_building(*args, **kwargs):
    raise TriedToBuild


def test_the_default_build_is_shipped_and_read_from_the_package(tmp_path, monkeypatch):
    monkeypatch.delenv(shipped.SHIP_ENV, raising=False)
    monkeypatch.setattr(toy_assets, "pretrain_lm", _no_building)
    assets = toy_assets.build_toy_assets(tmp_path, progress=False)
    # the package ships exactly the default settings' build (a change of the defaults changes the
    # hash: this fails until the shipped build is remade, python -m elfreg.toy.shipped)
    assert assets.shipped and assets.reused and assets.root.parent == shipped.SHIPPED_DIR
    assert list(tmp_path.iterdir()) == []  # nothing built, nothing written into the cache
    record = shipped.provenance(assets.root)
    assert record["kernels"] == "AVX2" and record["settings_hash"] == assets.root.name.split("-", 1)[1]
    assert "sha256" not in record
    encoder = AutoModelForCausalLM.from_pretrained(assets.encoder_dir)
    assert encoder.config.hidden_size == toy_assets.DEFAULT_ENCODER.hidden_size
    assert encoder.config.num_hidden_layers == toy_assets.DEFAULT_ENCODER.num_layers
    assert Path(resolve_toy_id("toy:teacher")) == assets.teacher_dir  # what `toy:` ids name
    assert assets.report["teacher"]["steps"] == toy_assets.DEFAULT_TEACHER.steps


@pytest.mark.parametrize("how", ["env", "argument"])
def test_the_shipped_build_can_be_bypassed(tmp_path, monkeypatch, how):
    monkeypatch.setattr(toy_assets, "pretrain_lm", _no_building)
    if how == "env":
        monkeypatch.setenv(shipped.SHIP_ENV, "build")
        kwargs = {}
    else:
        monkeypatch.delenv(shipped.SHIP_ENV, raising=False)
        kwargs = {"shipped": False}
    with pytest.raises(TriedToBuild):
        toy_assets.build_toy_assets(tmp_path, progress=False, side_by_side=False, **kwargs)


def test_a_misspelt_ship_setting_is_refused(monkeypatch):
    monkeypatch.setenv(shipped.SHIP_ENV, "no")
    with pytest.raises(ValueError, match="ELFREG_TOY_LMS must be 'build' or 'shipped'"):
        shipped.shipped_wanted()


def test_a_shipped_build_is_checked_file_by_file(tmp_path, monkeypatch):
    monkeypatch.delenv(shipped.SHIP_ENV, raising=False)
    built = toy_assets.build_toy_assets(tmp_path / "cache", **BUILD)
    ship_dir = tmp_path / "shipped"
    dest = shipped.ship(built.root, shipped_dir=ship_dir, note="a test build")
    assert shipped.find_shipped(dest.name, ship_dir) == dest
    assert shipped.find_shipped("full-0000000000000000", ship_dir) is None
    assert shipped.provenance(dest)["note"] == "a test build"
    # the build the package ships is what build_toy_assets returns for its settings
    monkeypatch.setattr(shipped, "SHIPPED_DIR", ship_dir)
    again = toy_assets.build_toy_assets(tmp_path / "other-cache", **BUILD)
    assert again.shipped and again.root == dest and not (tmp_path / "other-cache").exists()

    weights = dest / "encoder" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(shipped.ShippedAssetsDamaged, match="differs from its recorded SHA-256"):
        shipped.find_shipped(dest.name, ship_dir)
    weights.unlink()
    with pytest.raises(shipped.ShippedAssetsDamaged, match=r"missing \['encoder/model.safetensors'\]"):
        shipped.find_shipped(dest.name, ship_dir)


def test_the_package_data_globs_carry_every_shipped_file():
    """pyproject's package-data patterns (what a wheel takes besides modules) match every file
    of every shipped build."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["elfreg.toy"]
    package = ROOT / "src" / "elfreg" / "toy"
    carried = {p for pattern in globs for p in package.glob(pattern) if p.is_file()}
    files = {p for p in shipped.SHIPPED_DIR.rglob("*") if p.is_file()}
    assert files and files <= carried


def test_remaking_the_shipped_build_keeps_the_default_build_alone(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(shipped.SHIP_ENV, raising=False)
    built = toy_assets.build_toy_assets(tmp_path / "cache", **BUILD)
    ship_dir = tmp_path / "shipped"
    (ship_dir / "full-0000000000000000").mkdir(parents=True)  # a build of settings no longer the default
    monkeypatch.setattr(shipped, "SHIPPED_DIR", ship_dir)
    monkeypatch.setattr(toy_assets, "build_toy_assets", lambda **kwargs: built)  # what main builds
    assert shipped.main(["--note", "remade"]) == 0
    assert [p.name for p in ship_dir.iterdir()] == [built.root.name]
    assert shipped.provenance(ship_dir / built.root.name)["note"] == "remade"
    assert "removed the shipped build of other settings, full-0000000000000000" in capsys.readouterr().out
