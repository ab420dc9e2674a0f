"""Data files read from a wheel in the cache, without installing the package."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tl_reward.data import packages


def test_files_come_from_the_cached_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TL_REWARD_CACHE", str(tmp_path))
    monkeypatch.setitem(packages.PINNED, "tlr-fake-data", "1.2")
    (tmp_path / "wheels").mkdir()
    with zipfile.ZipFile(tmp_path / "wheels" / "tlr_fake_data-1.2-py3-none-any.whl", "w") as z:
        z.writestr("tlr_fake_data/__init__.py", "raise ImportError('never imported')\n")
        z.writestr("tlr_fake_data/data/set/a.jsonl", '{"prompt": "hi"}\n')
        z.writestr("tlr_fake_data-1.2.dist-info/METADATA", "Name: tlr-fake-data\n")
    got = packages.package_files("tlr-fake-data", "data")
    assert got == tmp_path / "packages" / "tlr-fake-data-1.2" / "data"
    assert (got / "set" / "a.jsonl").read_text() == '{"prompt": "hi"}\n'
    assert sorted(p.name for p in got.rglob("*") if p.is_file()) == ["a.jsonl"]
    (got / "set" / "a.jsonl").write_text("kept")  # extracted once, then read from the cache
    assert (packages.package_files("tlr-fake-data", "data") / "set" / "a.jsonl").read_text() \
        == "kept"
    with pytest.raises(Exception, match="no tlr_fake_data/missing/ folder"):
        packages.package_files("tlr-fake-data", "missing")


def test_environment_is_consistent() -> None:
    """``pip check`` is clean after the README's install: the data packages are read from
    their wheels, never installed without their requirements."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-2000:]
