"""Sweep jobs run by the local executor write the file score_vocabulary writes, and resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tl_reward import HookedRewardModel
from tl_reward.errors import TLRewardError
from tl_reward.scale import LocalExecutor, SweepJob, run_sweeps
from tl_reward.sweep.store import parts_dir
from tl_reward.sweep.vocab_sweep import load_sweep, score_vocabulary
from tl_reward.testing.tiny import save_tiny_reward_model

PROMPTS = {"best": "What is best?", "worst": "What is worst?"}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    return save_tiny_reward_model(tmp_path_factory.mktemp("rm") / "llama", "llama")


def reference(model_dir: Path, out: Path, **kw) -> bytes:
    """The single-process sweep (same threads as the executor's worker)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = HookedRewardModel.from_pretrained(str(model_dir), device="cpu")
        score_vocabulary(model, PROMPTS, output=out, progress=False, **kw)
    finally:
        torch.set_num_threads(threads)
    return out.read_bytes()


def test_local_jobs_equal_single_process_and_resume(saved: Path, tmp_path: Path) -> None:
    ref = reference(saved, tmp_path / "ref.parquet", batch_size=16)
    ref_shard = reference(saved, tmp_path / "ref1.parquet", batch_size=16, shard=(1, 3))
    jobs = [SweepJob(str(saved), tmp_path / "a.parquet", PROMPTS, batch_size=16),
            SweepJob(str(saved), tmp_path / "b.parquet", PROMPTS, batch_size=16, shard=(1, 3))]
    seen: list[int] = []

    def stop_after_five(job, chunk):  # an interrupted driver: some chunks are on disk
        seen.append(chunk)
        if len(seen) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweeps(jobs, LocalExecutor(threads=1), unit_chunks=2, progress=False,
                   callback=stop_after_five)
    assert not jobs[0].output.exists()
    assert len(list(parts_dir(jobs[0].output).glob("chunk-*.parquet"))) == 5
    written: list[int] = []
    paths = run_sweeps(jobs, LocalExecutor(threads=1), unit_chunks=2, progress=False,
                       callback=lambda job, c: written.append(c))
    assert [p.name for p in paths] == ["a.parquet", "b.parquet"]
    assert jobs[0].output.read_bytes() == ref  # no row lost or written twice
    assert jobs[1].output.read_bytes() == ref_shard
    n_chunks = -(-len(load_sweep(jobs[0].output)) // 16)
    assert len(written) == n_chunks - 5 + -(-len(load_sweep(jobs[1].output)) // 16)
    # a finished job is skipped entirely
    again: list[int] = []
    run_sweeps(jobs, LocalExecutor(threads=1), progress=False,
               callback=lambda j, c: again.append(c))
    assert again == [] and jobs[0].output.read_bytes() == ref


def test_bad_jobs_are_explained(saved: Path, tmp_path: Path) -> None:
    job = SweepJob(str(saved), tmp_path / "x.parquet", PROMPTS)
    with pytest.raises(TLRewardError, match="same output"):
        run_sweeps([job, job])
    with pytest.raises(TLRewardError, match="unit_chunks"):
        run_sweeps([job], unit_chunks=0)


def _unit_threads(worker, fail: bool = False) -> int:
    """A unit reporting the torch threads it runs with (raising when asked)."""
    if fail:
        raise ValueError("unit failed")
    return torch.get_num_threads()


def test_threads_apply_inside_units_and_the_callers_count_is_kept() -> None:
    before = torch.get_num_threads()
    requested = 2 if before == 1 else 1  # differs from the caller's, so a leak shows
    by_unit: dict[int, int] = {}
    in_callback: list[int] = []

    def on_result(i: int, threads: int) -> None:
        by_unit[i] = threads
        in_callback.append(torch.get_num_threads())

    with LocalExecutor(threads=requested).session() as pool:
        assert torch.get_num_threads() == before
        planned = pool.gather(_unit_threads, [()])
        assert torch.get_num_threads() == before
        pool.stream(_unit_threads, [()] * 3, on_result)
        with pytest.raises(ValueError, match="unit failed"):
            pool.stream(_unit_threads, [(True,)], on_result)
    # planning calls and units ran with the requested threads ...
    assert planned == [requested] and by_unit == {0: requested, 1: requested, 2: requested}
    # ... while the caller (its result callbacks included) kept its own, also after a failure
    assert in_callback == [before] * 3
    assert torch.get_num_threads() == before
