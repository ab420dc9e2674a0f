"""A driver SIGKILLed in the middle of the faithfulness, probe or Grams job (no cleanup, no
``finally``) leaves only finished units on disk; rerunning the same call gives exactly the
single-process result and scores only what was missing."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from scale_jobs import (
    DIMS,
    GRAM_KW,
    INPUTS,
    ITEMS,
    PAIRS,
    PROBE_KW,
    assert_same_faithfulness,
    assert_same_grams,
    assert_same_probes,
    drive_job,
    killed_driver,
)

from tl_reward.scale import LocalExecutor, run_faithfulness, run_layer_grams, run_probes


@pytest.mark.parametrize("job", ["faith", "probes", "grams"])
def test_sigkilled_driver_resumes_to_the_single_process_result(job: str, job_models, references,
                                                               tmp_path: Path) -> None:
    path, _ = job_models["llama"]
    assert killed_driver(drive_job, job, path, str(tmp_path)) == -signal.SIGKILL
    ex = LocalExecutor(threads=1)
    rest: list[object] = []
    if job == "faith":
        assert len(list(tmp_path.glob("*.json"))) == 3  # the three pairs the driver finished
        got = run_faithfulness(path, PAIRS, "head", cache_dir=tmp_path, executor=ex,
                               pairs_per_unit=2, progress=False, callback=rest.append)
        assert rest == list(range(3, 10))  # none of the three scored again
        assert_same_faithfulness(got, references["faith"])
    elif job == "probes":
        got = run_probes(path, ITEMS, DIMS, output_dir=tmp_path, executor=ex, progress=False,
                         on_chunk=rest.append, **PROBE_KW)
        assert rest == [3, 4]  # 10 items in chunks of 2: chunks 0-2 were on disk
        assert_same_probes(got, references["probes"])
    else:
        assert len(list(tmp_path.rglob("*.npz"))) == 3
        (got,) = run_layer_grams(path, INPUTS, cache_dir=tmp_path, executor=ex,
                                 batches_per_unit=2, progress=False,
                                 callback=lambda *a: rest.append(a), **GRAM_KW)
        assert len(rest) == 1  # 8 batches in units of 2: 4 units, 3 on disk
        assert_same_grams(got, references["grams_pooled"][0])
