"""Every notebook in tutorials/ runs top to bottom on a tiny model (TL_REWARD_TINY=1)."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tl_reward.testing.browser import chromium_path, page_problems, render_page

TUTORIALS = sorted((Path(__file__).resolve().parents[1] / "tutorials").glob("*.ipynb"))


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_executes(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TL_REWARD_TINY", "1")
    monkeypatch.setenv("TL_REWARD_OUT", str(tmp_path))
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    # a probe cell, run last in the notebook's own kernel: what that kernel saw
    nb.cells.append(nbformat.v4.new_code_cell(
        "import os as _os, json as _json\n"
        "print(_json.dumps({'tiny': _os.environ.get('TL_REWARD_TINY'),"
        " 'out': _os.environ.get('TL_REWARD_OUT')}))"))
    client.execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    # every cell ran, in order (a skipped or re-ordered cell has no or a wrong execution count)
    assert [c.get("execution_count") for c in code] == list(range(1, len(code) + 1))
    probe = json.loads(code[-1]["outputs"][0]["text"])
    assert probe == {"tiny": "1", "out": str(tmp_path)}  # the kernel ran in tiny mode
    # every HTML report it wrote renders completely, offline, in a browser
    if chromium_path() is not None:
        for page in sorted(tmp_path.rglob("*.html")):
            assert page_problems(render_page(page)) == [], page.name
