"""Shared pytest fixtures: tiny seeded reward models of every architecture, the shared data."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# one torch thread: the tests' models are small, and with two threads on two cores any
# other busy process (a Ray actor, a kernel, chromium) made the same tests 2-30x slower
torch.set_num_threads(1)

from helpers import SHARED, smollm2_unavailable, tiny_models  # noqa: E402


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """pytest-xdist (``-n 2``, pyproject's addopts) runs each test module whole on one worker,
    so its module fixtures are built once, and all of tests/scale on one worker, so its session
    fixtures (the job models and references, one local Ray cluster) are too."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # modules in collection order: the slowest first

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "tests/scale" if module.startswith("tests/scale/") else module

    return ByModule(config, log)


#: The longest modules, started first so that neither worker is left with one at the end.
SLOW_FIRST = ("tests/test_tutorials.py", "tests/scale/", "tests/model/test_smollm2.py",
              "tests/process/test_demo_prm.py", "tests/sweep/test_sweep.py",
              "tests/stats/test_calibration.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run :data:`SLOW_FIRST`'s modules first (a stable sort: each module stays whole)."""
    def rank(item: pytest.Item) -> int:
        return next((i for i, p in enumerate(SLOW_FIRST) if item.nodeid.startswith(p)),
                    len(SLOW_FIRST))
    items.sort(key=rank)


@pytest.fixture(scope="session")
def _demo_rm_once():  # noqa: ANN202
    from tl_reward import DEMO_MODEL_NAME, HookedRewardModel

    if (reason := smollm2_unavailable()) is not None:
        pytest.skip(reason)
    return HookedRewardModel.from_pretrained(DEMO_MODEL_NAME, device="cpu")


@pytest.fixture
def demo_rm(_demo_rm_once):  # noqa: ANN001, ANN201
    """The demo RM, loaded once per session (about 8 s a load); its hooks are reset around each
    test, and a test must not change its weights."""
    _demo_rm_once.reset_hooks(including_permanent=True)
    yield _demo_rm_once
    _demo_rm_once.reset_hooks(including_permanent=True)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.exists():
        pytest.skip(f"shared data folder {SHARED} is missing (run from a checkout beside shared/)")
    return SHARED


@pytest.fixture(scope="session")
def hh_path(shared_dir: Path) -> Path:
    path = shared_dir / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
    if not path.exists():
        pytest.skip(f"{path} is missing")
    return path


@pytest.fixture(scope="session")
def tiny() -> tiny_models:
    """``tiny(arch, num_labels=1)`` -> (HookedRewardModel, hf_model, tokenizer), cached."""
    return tiny_models()


@pytest.fixture(params=["cpu", "cuda"])
def device(request: pytest.FixtureRequest) -> str:
    """Each analysis's device path: ``"cpu"`` always, ``"cuda"`` where a GPU is available."""
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine; the cuda path runs where one is available")
    return request.param
