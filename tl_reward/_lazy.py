"""Package attributes imported on first use, so ``tl-reward --help`` never imports torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]
                 ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for a package whose ``exports`` map a public name to the
    module defining it."""

    def getattr_(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    def dir_() -> list[str]:
        return sorted(exports)

    return getattr_, dir_
