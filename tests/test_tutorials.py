"""Every notebook in tutorials/ runs top to bottom on a tiny model (TL_REWARD_TINY=1)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tl_reward.testing.browser import chromium_path, page_problems, render_page

TUTORIALS = sorted((Path(__file__).resolve().parents[1] / "tutorials").glob("*.ipynb"))
#: a probe cell, run last in the notebook's own kernel: what that kernel saw
PROBE = ("import os as _os, json as _json\n"
         "print(_json.dumps({'tiny': _os.environ.get('TL_REWARD_TINY'),"
         " 'out': _os.environ.get('TL_REWARD_OUT')}))")


@pytest.fixture(scope="module")
def executed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, tuple[nbformat.NotebookNode, Path, BaseException | None]]:
    """Every selected tutorial executed in tiny mode, in its own kernel, two kernels at a time
    (most of a run is its kernel importing torch and TransformerLens, on one core): stem ->
    (the executed notebook, its ``TL_REWARD_OUT`` folder, the error it raised or ``None``)."""
    selected = [i.callspec.params["path"] for i in request.session.items
                if i.path == Path(__file__).resolve() and hasattr(i, "callspec")]
    out: dict[str, tuple[nbformat.NotebookNode, Path, BaseException | None]] = {}

    async def run(path: Path, slots: asyncio.Semaphore) -> None:
        nb = nbformat.read(path, as_version=4)
        nb.cells.append(nbformat.v4.new_code_cell(PROBE))
        folder = tmp_path_factory.mktemp(path.stem)
        # one torch thread per kernel: two kernels share the cores
        env = {**os.environ, "TL_REWARD_TINY": "1", "TL_REWARD_OUT": str(folder),
               "OMP_NUM_THREADS": "1"}
        client = NotebookClient(nb, timeout=900, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}})
        async with slots:
            try:
                await client.async_execute(env=env)
                out[path.stem] = (nb, folder, None)
            except Exception as exc:  # reported by the notebook's own test
                out[path.stem] = (nb, folder, exc)

    async def run_all() -> None:
        slots = asyncio.Semaphore(max(1, min(2, os.cpu_count() or 1)))
        await asyncio.gather(*(run(p, slots) for p in selected))

    asyncio.run(run_all())
    return out


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_executes(path: Path, executed) -> None:
    nb, folder, error = executed[path.stem]
    if error is not None:
        raise error
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    # every cell ran, in order (a skipped or re-ordered cell has no or a wrong execution count)
    assert [c.get("execution_count") for c in code] == list(range(1, len(code) + 1))
    probe = json.loads(code[-1]["outputs"][0]["text"])
    assert probe == {"tiny": "1", "out": str(folder)}  # the kernel ran in tiny mode
    # every HTML report it wrote renders completely, offline, in a browser
    if chromium_path() is not None:
        for page in sorted(folder.rglob("*.html")):
            assert page_problems(render_page(page)) == [], page.name
