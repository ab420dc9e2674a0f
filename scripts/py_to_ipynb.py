"""Turn a percent-format script (``# %%`` code cells, ``# %% [markdown]`` cells) into a notebook.

Usage: python scripts/py_to_ipynb.py tutorials/src.py tutorials/01_quickstart.ipynb
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat


def convert(text: str) -> nbformat.NotebookNode:
    """Split on ``# %%`` markers; markdown cells drop their leading ``# ``."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    for chunk in text.split("# %%")[1:]:
        header, _, body = chunk.partition("\n")
        body = body.strip("\n")
        if "[markdown]" in header:
            lines = [ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in body.splitlines()]
            nb.cells.append(nbformat.v4.new_markdown_cell("\n".join(lines)))
        elif body:
            nb.cells.append(nbformat.v4.new_code_cell(body))
    return nb


def main() -> None:
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    nbformat.write(convert(src.read_text()), dst)


if __name__ == "__main__":
    main()
