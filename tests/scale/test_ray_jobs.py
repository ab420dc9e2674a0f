"""The faithfulness, probe and Grams jobs on a local Ray cluster: exactly the single-process
results; with both actors killed (``os._exit``) halfway through a unit and the driver
interrupted after k results, a rerun gives the identical result, with no unit written twice
or lost."""

from __future__ import annotations

from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")

from scale_jobs import (  # noqa: E402
    DIMS,
    GRAM_KW,
    HALF,  # noqa: E402
    INPUTS,
    ITEMS,
    PAIRS,
    PROBE_KW,
    assert_same_behaviour,
    assert_same_faithfulness,
    assert_same_grams,
    assert_same_probes,
)

from tl_reward.scale import (  # noqa: E402
    RayExecutor,
    run_compare_models,
    run_faithfulness,
    run_layer_grams,
    run_probes,
)


class Stop(Exception):
    """An interrupted driver."""


def crashing(tmp_path: Path, **kw: object) -> tuple[RayExecutor, Path]:
    """Two actors that each die halfway through their second unit (then restart, once)."""
    marker = tmp_path / "crashes"
    marker.mkdir()
    return RayExecutor(num_workers=2, crash_after_units=2, crash_marker=str(marker),
                       **HALF, **kw), marker


def armed(pool: object, tmp_path: Path) -> Path:
    """The session pool's two actors armed to die halfway through their second unit from now
    (then restart, unarmed): the workers of a running pool killed, without starting a pool."""
    marker = tmp_path / "crashes"
    marker.mkdir()
    pool.arm_crash(2, str(marker))
    return marker


def stop_after(k: int, seen: list) -> object:
    def cb(*a: object) -> None:
        seen.append(a if len(a) > 1 else a[0])
        if len(seen) == k:
            raise Stop
    return cb


def test_jobs_on_one_ray_pool_equal_single_process(pool, job_models, references) -> None:
    llama, qwen2 = job_models["llama"][0], job_models["qwen2"][0]
    assert len({ray.get(a.info.remote())["pid"] for a in pool.actors}) == 2
    assert_same_faithfulness(run_faithfulness(llama, PAIRS, "head", executor=pool,
                                              pairs_per_unit=2, progress=False),
                             references["faith"])
    assert_same_probes(run_probes(llama, ITEMS, DIMS, executor=pool, progress=False,
                                  **PROBE_KW), references["probes"])
    for got, ref in zip(run_layer_grams([llama, qwen2], INPUTS, executor=pool,
                                        batches_per_unit=2, progress=False, **GRAM_KW),
                        references["grams_pooled"], strict=True):
        assert_same_grams(got, ref)
    # behavioural agreement: the two models' forward passes on the two actors at once
    from scale_jobs import one_thread

    from tl_reward.compare.behaviour import compare_models

    kw = {"pairs": PAIRS[:4], "batch_size": 5}
    ref = one_thread(lambda: compare_models([job_models["qwen2"][1], job_models["llama1"][1]],
                                            INPUTS[:20], **kw))
    assert_same_behaviour(run_compare_models([qwen2, job_models["llama1"][0]], INPUTS[:20],
                                             executor=pool, progress=False, **kw), ref)


def test_faithfulness_killed_workers_and_driver_resume(pool, job_models, references,
                                                       tmp_path: Path) -> None:
    path = job_models["llama"][0]
    marker = armed(pool, tmp_path)
    first: list[int] = []
    with pytest.raises(Stop):
        run_faithfulness(path, PAIRS, "head", cache_dir=tmp_path / "c", executor=pool,
                         pairs_per_unit=1, progress=False, callback=stop_after(6, first))
    assert len(list(marker.iterdir())) == 2  # both actors really died mid-unit
    assert len(list((tmp_path / "c").glob("*.json"))) == len(set(first) - {4})
    rest: list[int] = []
    got = run_faithfulness(path, PAIRS, "head", cache_dir=tmp_path / "c", executor=pool,
                           pairs_per_unit=2, progress=False, callback=rest.append)
    assert_same_faithfulness(got, references["faith"])
    scored = [i for i in first + rest if i != 4]  # the zero-margin pair is never cached
    assert sorted(scored) == [i for i in range(len(PAIRS)) if i != 4]  # each once


def test_probes_killed_workers_and_driver_resume(pool, job_models, references,
                                                 tmp_path: Path) -> None:
    path, ref = job_models["llama"][0], references["probes"]
    # no retries by Ray: the dead actors' units come back failed and this process resubmits
    # them; the run goes to the end, so a resubmitted unit that got lost would fail it
    executor, marker = crashing(tmp_path, max_task_retries=0)
    written: list[int] = []
    with executor.session() as crashing_pool:
        got = run_probes(path, ITEMS, DIMS, output_dir=tmp_path / "a", executor=crashing_pool,
                         chunks_per_unit=1, progress=False, on_chunk=written.append,
                         **PROBE_KW)
    assert len(list(marker.iterdir())) == 2 and crashing_pool.resubmitted >= 2
    assert sorted(written) == list(range(5))  # 5 chunks of 2 items, each written once
    assert_same_probes(got, ref)
    # a driver interrupted after 2 chunks, then rerun
    first: list[int] = []
    with pytest.raises(Stop):
        run_probes(path, ITEMS, DIMS, output_dir=tmp_path / "b", executor=pool,
                   chunks_per_unit=1, progress=False, on_chunk=stop_after(2, first),
                   **PROBE_KW)
    rest: list[int] = []
    got = run_probes(path, ITEMS, DIMS, output_dir=tmp_path / "b", executor=pool,
                     progress=False, on_chunk=rest.append, **PROBE_KW)
    assert_same_probes(got, ref)
    assert sorted(first + rest) == list(range(5))


def test_grams_killed_workers_and_driver_resume(pool, job_models, references,
                                                tmp_path: Path) -> None:
    path = job_models["llama"][0]
    marker = armed(pool, tmp_path)
    kw = {"positions": "response", "layer_chunk": 2, "cache_dir": tmp_path / "g",
          "batches_per_unit": 2, "progress": False, **GRAM_KW}
    first: list[tuple] = []
    with pytest.raises(Stop):
        run_layer_grams(path, INPUTS, executor=pool, callback=stop_after(4, first), **kw)
    assert len(list(marker.iterdir())) == 2
    rest: list[tuple] = []
    (got,) = run_layer_grams(path, INPUTS, executor=pool, callback=lambda *a: rest.append(a),
                             **kw)
    assert_same_grams(got, references["grams_response"])
    # 2 hook groups x 4 units of 2 batches, each read once
    assert sorted(first + rest) == [(0, g, u) for g in range(2) for u in range(4)]


def test_cli_audit_on_ray_writes_the_single_process_store(cluster, job_models, tmp_path: Path,
                                                          capsys) -> None:
    import json

    from scale_jobs import one_thread

    from tl_reward.audit.perturbations import user_items
    from tl_reward.audit.probes import run_probes as single_run_probes
    from tl_reward.cli import main

    path, model = job_models["llama"]
    rows = [{"prompt": it.user_turn, "reply": it.reply} for it in ITEMS]
    src = tmp_path / "items.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "audit.html"
    args = ["audit", "--model", path, "--items", str(src), "--dimensions", ",".join(DIMS),
            "--permutations", "4995", "--seed", "1", "--output", str(out), "--ray", "--workers",
            "1", "--cpus-per-worker", "0.5"]
    assert main(args) == 0
    assert "(Ray)" in capsys.readouterr().out
    text = out.read_text()
    assert "<h2>Probes" in text and "<h2>Cascade" in text
    assert "<h2>The published probes" in text  # scored on the actor
    assert "<h2>Reward-term conflict" in text  # two objectives: loaded here for geometry
    items = user_items(rows, source="items")
    ref = one_thread(lambda: single_run_probes(model, items, DIMS, seed=1, n_permutations=4995,
                                               progress=False))
    # the single-process call finds every chunk the Ray run wrote, and they are its own rows
    again = single_run_probes(model, items, DIMS, seed=1, n_permutations=4995, progress=False,
                              output_dir=tmp_path / "audit.html.runs",
                              on_chunk=lambda i: pytest.fail("rescored"))
    assert_same_probes(again, ref)
    with pytest.raises(SystemExit):
        main(["audit", "--help"])
    assert "--gpus-per-worker" in capsys.readouterr().out


def test_cli_compare_on_ray_equal_single_process(cluster, job_models, tmp_path: Path,
                                                 monkeypatch, capsys) -> None:
    """``tl-reward compare --ray --layers``: behaviour and layer maps exactly as in one
    process, and this process loads no model."""
    import json

    import numpy as np
    from scale_jobs import one_thread

    import tl_reward.compare.behaviour as behaviour
    import tl_reward.compare.layers as layers
    from tl_reward import HookedRewardModel
    from tl_reward.cli import main
    from tl_reward.cli.compare import read_compare_input
    from tl_reward.compare.behaviour import compare_models

    monkeypatch.setattr(HookedRewardModel, "from_pretrained",
                        lambda *a, **k: pytest.fail("a model was loaded in the driver"))
    reps, real_features = [], behaviour.compare_features
    monkeypatch.setattr(behaviour, "compare_features",
                        lambda *a, **k: reps.append(real_features(*a, **k)) or reps[-1])

    src = tmp_path / "corpus.jsonl"
    src.write_text("\n".join(json.dumps({"prompt": p, "response": r}) for p, r in INPUTS[:12]))
    maps, real, grams = [], layers.compare_grams, layers.layer_grams
    monkeypatch.setattr(layers, "compare_grams", lambda *a: maps.append(real(*a)) or maps[-1])
    monkeypatch.setattr(layers, "layer_grams", lambda *a, **k: pytest.fail("read here"))
    (a, ma), (b, mb) = job_models["llama1"], job_models["qwen2"]  # one reward each
    assert main(["compare", "--model", a, "--model", b, "--input", str(src), "--layers",
                 "--permutations", "9", "--output",
                 str(tmp_path / "c.html"), "--ray", "--workers", "1", "--cpus-per-worker",
                 "0.5"]) == 0
    assert "Layer x layer" in (tmp_path / "c.html").read_text()
    corpus, _ = read_compare_input(src)
    want = one_thread(lambda: real(grams(ma, corpus), grams(mb, corpus),
                                   ["debiased_cka", "rv2"], 9))
    assert len(maps) == 1 and maps[0].measures == want.measures
    names = [Path(a).name, Path(b).name]
    assert_same_behaviour(reps[0], one_thread(lambda: compare_models(
        dict(zip(names, (ma, mb), strict=True)), corpus)))
    for m in want.measures:
        np.testing.assert_array_equal(maps[0].observed[m], want.observed[m])
        np.testing.assert_array_equal(maps[0].p_value[m], want.p_value[m])
