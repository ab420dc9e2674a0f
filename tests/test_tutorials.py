"""Every notebook in tutorials/ runs top to bottom on a tiny model (TL_REWARD_TINY=1)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from warm_kernels import warm_kernels

from tl_reward.testing.browser import chromium_path, page_problems, render_page

TUTORIALS = sorted((Path(__file__).resolve().parents[1] / "tutorials").glob("*.ipynb"))
#: a probe cell, run last in the notebook's own kernel: what that kernel saw
PROBE = ("import os as _os, json as _json\n"
         "print(_json.dumps({'tiny': _os.environ.get('TL_REWARD_TINY'),"
         " 'out': _os.environ.get('TL_REWARD_OUT'), 'pid': _os.getpid()}))")


@pytest.fixture(scope="module")
def executed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, tuple[nbformat.NotebookNode, Path, BaseException | None]]:
    """Every selected tutorial executed in tiny mode, in its own kernel, two kernels at a time:
    stem -> (the executed notebook, its ``TL_REWARD_OUT`` folder, the error it raised or
    ``None``). Each kernel is a fresh process forked from one that imported torch and
    TransformerLens once (:mod:`warm_kernels`; a cold kernel spends most of a tiny run on
    those imports), with one torch thread: two kernels share the cores."""
    selected = [i.callspec.params["path"] for i in request.session.items
                if i.path == Path(__file__).resolve() and hasattr(i, "callspec")]
    out: dict[str, tuple[nbformat.NotebookNode, Path, BaseException | None]] = {}
    shared = {**os.environ, "OMP_NUM_THREADS": "1"}

    async def run(path: Path, slots: asyncio.Semaphore, kernel: Callable[[], object]) -> None:
        nb = nbformat.read(path, as_version=4)
        nb.cells.append(nbformat.v4.new_code_cell(PROBE))
        folder = tmp_path_factory.mktemp(path.stem)
        env = {**shared, "TL_REWARD_TINY": "1", "TL_REWARD_OUT": str(folder)}
        km = kernel()
        client = NotebookClient(nb, timeout=900, km=km,
                                resources={"metadata": {"path": str(path.parent)}})
        async with slots:
            try:
                await client.async_execute(env=env)
                out[path.stem] = (nb, folder, None)
            except Exception as exc:  # reported by the notebook's own test
                out[path.stem] = (nb, folder, exc)
            finally:
                if km.has_kernel:
                    await km.shutdown_kernel()

    async def run_all(kernel: Callable[[], object]) -> None:
        slots = asyncio.Semaphore(max(1, min(2, os.cpu_count() or 1)))
        await asyncio.gather(*(run(p, slots, kernel) for p in selected))

    with warm_kernels(tmp_path_factory.mktemp("kernels"), shared) as kernel:
        asyncio.run(run_all(kernel))
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
    # the kernel ran in tiny mode, in a process of its own
    assert probe == {"tiny": "1", "out": str(folder), "pid": probe["pid"]}
    assert probe["pid"] not in {json.loads(n.cells[-1]["outputs"][0]["text"])["pid"]
                                for s, (n, _, e) in executed.items() if s != path.stem and not e}
    # every HTML report it wrote renders completely, offline, in a browser
    if chromium_path() is not None:
        for page in sorted(folder.rglob("*.html")):
            assert page_problems(render_page(page)) == [], page.name
