"""The faithfulness, probe and Grams jobs on the local executor (no Ray): exactly the
single-process results, whatever order units finish in; an interrupted driver resumes with no
unit lost or scored twice; a lost unit is an error, never a silently shorter result."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import PicklePayload
from scale_jobs import (
    DIMS,
    GRAM_KW,
    INPUTS,
    ITEMS,
    PAIRS,
    PROBE_KW,
    assert_same_behaviour,
    assert_same_faithfulness,
    assert_same_grams,
    assert_same_probes,
    one_thread,
)

import tl_reward.analysis.faithfulness as faith
from tl_reward.audit.probes import run_probes as single_run_probes
from tl_reward.errors import TLRewardError
from tl_reward.scale import (
    LocalExecutor,
    run_compare_layers,
    run_compare_models,
    run_faithfulness,
    run_layer_grams,
    run_probes,
)
from tl_reward.scale.executors import Worker, _LocalPool


class Stop(Exception):
    """An interrupted driver."""


def stop_after(k: int, seen: list) -> object:
    def cb(*a: object) -> None:
        seen.append(a if len(a) > 1 else a[0])
        if len(seen) == k:
            raise Stop
    return cb


class ReversedPool(_LocalPool):
    """Finishes units last to first (Ray returns them in any order)."""

    def stream(self, fn, units, on_result):  # noqa: ANN001, ANN201
        for i in reversed(range(len(units))):
            on_result(i, self.worker.unit(fn, *units[i]))


class DroppingPool(_LocalPool):
    """Loses the second unit (a retried unit that never came back)."""

    def stream(self, fn, units, on_result):  # noqa: ANN001, ANN201
        for i, args in enumerate(units):
            if i != 1:
                on_result(i, self.worker.unit(fn, *args))


def local() -> LocalExecutor:
    return LocalExecutor(threads=1)


def test_faithfulness_local_equals_resumes_and_shares_the_cache(
        job_models, references, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, model = job_models["llama"]
    ref = references["faith"]
    assert len(ref) == 9 and [s["pair"] for s in ref.meta["skipped"]] == [4]
    first: list[int] = []
    with pytest.raises(Stop):
        run_faithfulness(path, PAIRS, "head", cache_dir=tmp_path, executor=local(),
                         pairs_per_unit=2, progress=False, callback=stop_after(3, first))
    assert first == [0, 1, 2] and len(list(tmp_path.glob("*.json"))) == 3
    rest: list[int] = []
    got = run_faithfulness(path, PAIRS, "head", cache_dir=tmp_path, executor=local(),
                           pairs_per_unit=2, progress=False, callback=rest.append)
    assert rest == list(range(3, 10))  # nothing scored twice (the zero-margin pair is not cached)
    assert_same_faithfulness(got, ref)
    # the files are faithfulness_report's own: it reads every pair and scores only the
    # zero-margin one (never cached)
    scored, real = [], faith.pair_scores
    monkeypatch.setattr(faith, "pair_scores", lambda m, tp, *a: scored.append(tp) or real(
        m, tp, *a))
    assert_same_faithfulness(faith.faithfulness_report(model, PAIRS, "head", cache_dir=tmp_path,
                                                       progress=False), ref)
    assert [tp.chosen_ids == tp.rejected_ids for tp in scored] == [True]
    assert json.loads(next(tmp_path.glob("*.json")).read_text()).keys() == {
        "names", "delta", "chosen", "rejected", "scores"}
    monkeypatch.undo()
    # units finishing last-first are put back in pair order
    assert_same_faithfulness(run_faithfulness(path, PAIRS, "head", executor=ReversedPool(
        Worker(1)), pairs_per_unit=3, progress=False), ref)
    # ... which the equality would catch: two pairs swapped give other tensors
    assert not torch.equal(ref.scores["noising"][[1, 0]], ref.scores["noising"][[0, 1]])
    with pytest.raises(TLRewardError, match=r"3 pairs of the faithfulness \(head\) job got no"):
        run_faithfulness(path, PAIRS, "head", executor=DroppingPool(Worker(1)),
                         pairs_per_unit=3, progress=False)


def test_probes_local_equal_resume_and_share_the_store(job_models, references,
                                                       tmp_path: Path) -> None:
    path, model = job_models["llama"]
    ref = references["probes"]
    first: list[int] = []
    with pytest.raises(Stop):
        run_probes(path, ITEMS, DIMS, output_dir=tmp_path, executor=local(), chunks_per_unit=2,
                   progress=False, on_chunk=stop_after(3, first), **PROBE_KW)
    run_dir = next(tmp_path.iterdir())
    assert first == [0, 1, 2] and len(list(run_dir.glob("chunk-*.parquet"))) == 3
    rest: list[int] = []
    got = run_probes(path, ITEMS, DIMS, output_dir=tmp_path, executor=local(),
                     chunks_per_unit=2, progress=False, on_chunk=rest.append, **PROBE_KW)
    assert rest == [3, 4] and got.run_dir == run_dir
    assert_same_probes(got, ref)
    # the single-process run_probes finds every chunk in the same store and scores none
    again = single_run_probes(model, ITEMS, DIMS, output_dir=tmp_path, progress=False,
                              on_chunk=lambda i: pytest.fail("rescored"), **PROBE_KW)
    assert_same_probes(again, ref)
    assert_same_probes(run_probes(path, ITEMS, DIMS, executor=ReversedPool(Worker(1)),
                                  chunks_per_unit=2, progress=False, **PROBE_KW), ref)
    swapped = ref.rows.iloc[np.r_[ref.rows.index[9:18], ref.rows.index[:9],
                                  ref.rows.index[18:]]].reset_index(drop=True)
    assert not swapped.equals(ref.rows)  # two items' rows out of order: caught
    with pytest.raises(TLRewardError, match="got no result"):
        run_probes(path, ITEMS, DIMS, executor=DroppingPool(Worker(1)), progress=False,
                   **PROBE_KW)
    # a bf16 spec: the workers load the model in bf16 (its own fingerprint), rows equal the
    # in-process bf16 run's, and differ from float32's (so the dtype really reached them)
    from tl_reward import HookedRewardModel
    from tl_reward.scale import ModelSpec

    bf16 = HookedRewardModel.from_pretrained(path, device="cpu", dtype=torch.bfloat16)
    want_bf16 = one_thread(lambda: single_run_probes(bf16, ITEMS[:4], DIMS, progress=False,
                                                     **PROBE_KW))
    got_bf16 = run_probes(ModelSpec(path, "bfloat16"), ITEMS[:4], DIMS, executor=local(),
                          progress=False, **PROBE_KW)
    assert_same_probes(got_bf16, want_bf16)
    assert got_bf16.rows["delta:objective_0"].dtype == np.float64  # float readout, bf16 model
    assert not np.allclose(got_bf16.rows["neutral:objective_0"].to_numpy(),
                           ref.rows["neutral:objective_0"].to_numpy()[:len(got_bf16.rows)],
                           rtol=0, atol=1e-6)
    # the 10 published probes, scored on a worker: run_published_probes' own table
    from tl_reward.compat.published import run_published_probes

    want = one_thread(lambda: run_published_probes(model, "objective_1"))
    got = run_published_probes(path, "objective_1", executor=local())
    pd.testing.assert_frame_equal(got.rows, want.rows, check_exact=True)
    assert got.table.equals(want.table) and want.table.n.tolist() == [3, 2, 2, 2, 1]


def test_grams_local_equal_resume_and_compare(job_models, references, tmp_path: Path) -> None:
    paths = [job_models[a][0] for a in ("llama", "qwen2")]
    for got, ref in zip(run_layer_grams(paths, INPUTS, executor=local(), batches_per_unit=3,
                                        progress=False, **GRAM_KW),
                        references["grams_pooled"], strict=True):
        assert_same_grams(got, ref)
    ref = references["grams_response"]
    assert ref.n_rows > 3 * len(INPUTS)  # response tokens: several rows per input
    kw = {"positions": "response", "layer_chunk": 2, "cache_dir": tmp_path,
          "batches_per_unit": 1, "progress": False, **GRAM_KW}
    first: list[tuple] = []
    with pytest.raises(Stop):
        run_layer_grams(paths[0], INPUTS, executor=local(), callback=stop_after(5, first), **kw)
    assert len(list(tmp_path.rglob("*.npz"))) == 5
    rest: list[tuple] = []
    (got,) = run_layer_grams(paths[0], INPUTS, executor=local(),
                             callback=lambda *a: rest.append(a), **kw)
    assert_same_grams(got, ref)
    units = {(m, g, u) for m in (0,) for g in (0, 1) for u in range(8)}  # 2 groups x 8 batches
    assert len(first) + len(rest) == len(units) and set(first) | set(rest) == units
    (got,) = run_layer_grams(paths[0], INPUTS, executor=ReversedPool(Worker(1)),
                             **{**kw, "cache_dir": None, "batches_per_unit": 3})
    assert_same_grams(got, ref)
    perm = np.random.default_rng(0).permutation(ref.n_rows)
    assert not np.array_equal(ref.grams[:, perm][:, :, perm], ref.grams)  # row order is seen
    with pytest.raises(TLRewardError, match="got no result"):
        run_layer_grams(paths[0], INPUTS, executor=DroppingPool(Worker(1)), progress=False,
                        **GRAM_KW)
    # the similarity maps: compare_layers' own on the same Grams
    from tl_reward.compare.layers import compare_grams

    res = run_compare_layers(paths[0], paths[1], INPUTS, n_permutations=19, executor=local(),
                             progress=False, **GRAM_KW)
    want = compare_grams(*references["grams_pooled"], n_permutations=19)
    for m in want.measures:
        np.testing.assert_array_equal(res.observed[m], want.observed[m])
        np.testing.assert_array_equal(res.p_value[m], want.p_value[m])


def test_cli_ray_options_are_shared_and_checked(tmp_path: Path, capsys) -> None:
    from tl_reward.cli import main

    for cmd in ("sweep", "audit", "compare"):  # one argument group, from cli/common.py
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        out = capsys.readouterr().out
        assert all(f in out for f in ("--ray", "--address", "--workers", "--gpus-per-worker",
                                      "--cpus-per-worker"))
    items = tmp_path / "items.jsonl"
    items.write_text("\n".join(json.dumps({"prompt": f"Why {i}?", "reply": "Because."})
                               for i in range(3)))  # an audit needs 3 items
    assert main(["audit", "--items", str(items), "--ray", "--device", "cpu"]) == 1
    assert "--device does not apply with --ray" in capsys.readouterr().err
    assert main(["compare", "--model", "a", "--model", "b", "--input", str(items),
                 "--ray", "--device", "cpu"]) == 1  # with --ray this process loads no model
    assert "--device does not apply with --ray" in capsys.readouterr().err


def test_compare_models_on_workers_equals_compare_models(job_models) -> None:
    """Each model's forward passes on a worker (one unit per model, finishing in any order):
    exactly ``compare_models`` on the loaded models, names included."""
    from scale_jobs import one_thread

    from tl_reward.compare.behaviour import compare_models

    names = ("qwen2", "llama1")
    loaded = [job_models[a][1] for a in names]
    paths = [job_models[a][0] for a in names]
    kw = {"pairs": [p for i, p in enumerate(PAIRS) if i != 4], "batch_size": 5}
    ref = one_thread(lambda: compare_models(loaded, INPUTS[:20], **kw))
    assert ref.readability and ref.preference and ref.rank  # every part is compared
    assert ref.models == list(paths)  # list models are named by their model_name (the path)
    assert_same_behaviour(run_compare_models(paths, INPUTS[:20], executor=local(),
                                             progress=False, **kw), ref)
    got = run_compare_models(dict(zip(ref.models, paths, strict=True)), INPUTS[:20],
                             executor=ReversedPool(Worker(1)), progress=False, **kw)
    assert_same_behaviour(got, ref)  # named by a mapping, units finishing last to first
    # the check sees which model is which: swapping the two models' rewards changes it
    swapped = run_compare_models(dict(zip(ref.models, paths[::-1], strict=True)), INPUTS[:20],
                                 executor=local(), progress=False, **kw)
    assert not np.array_equal(swapped.rewards[ref.models[0]], ref.rewards[ref.models[0]])


def test_grams_cache_refuses_another_run_identity(job_models, tmp_path: Path) -> None:
    """The Gram cache is a :class:`~tl_reward.store.ChunkStore`: a folder whose manifest records
    another model fingerprint (or tokenizer) is refused, naming the field, never read."""
    from tl_reward.store import StoreMismatchError

    path = job_models["llama"][0]
    run_layer_grams(path, INPUTS, executor=local(), cache_dir=tmp_path, progress=False,
                    **GRAM_KW)
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert folder.name.startswith("grams-") and list(folder.glob("*.npz"))
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps(
        {**manifest, "model_fingerprint": "0" * 32, "tokenizer": "1" * 32}))
    with pytest.raises(StoreMismatchError, match="model_fingerprint, tokenizer"):
        run_layer_grams(path, INPUTS, executor=local(), cache_dir=tmp_path, progress=False,
                        **GRAM_KW)


def test_a_tampered_grams_chunk_is_refused_naming_it(job_models, tmp_path: Path) -> None:
    """A stored unit's ``.npz`` holding a pickled object raised numpy's ValueError advising
    ``allow_pickle``; now the error names the chunk and says to delete it."""
    from tl_reward.errors import ResultFileError

    kw = {"cache_dir": tmp_path / "g", "batches_per_unit": 4, "progress": False, **GRAM_KW}
    run_layer_grams(job_models["llama"][0], INPUTS, executor=local(), **kw)
    chunk = sorted((tmp_path / "g").rglob("*.npz"))[0]
    marker = tmp_path / "payload-ran"
    with np.load(chunk) as z:
        arrays = {k: z[k] for k in z.files}
    with open(chunk, "wb") as f:
        np.savez(f, **{**arrays, "item": np.array([PicklePayload(marker)], dtype=object)})
    with pytest.raises(ResultFileError) as err:
        run_layer_grams(job_models["llama"][0], INPUTS, executor=local(), **kw)
    msg = str(err.value)
    assert str(chunk) in msg and "tampered" in msg and f"delete {chunk}" in msg
    assert "allow_pickle" not in msg and not marker.exists()
