"""The one local Ray cluster shared by every Ray test in tests/scale (skipped without Ray)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from scale_jobs import DIMS, GRAM_KW, HALF, INPUTS, ITEMS, PAIRS, PROBE_KW, one_thread


@pytest.fixture(scope="session")
def cluster():
    """A local cluster for the session: 2 CPUs and 2 logical GPUs (no real GPU needed)."""
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")
    started = not ray.is_initialized()
    # Ray nices its workers (15) by default: beside the suite's other workers its actors
    # starved (one test took 181 s in the suite, 33 s with this), and tests/scale became the
    # suite's longest chain
    os.environ.setdefault("RAY_worker_niceness", "0")
    if started:
        ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False,
                 object_store_memory=80 * 2**20, configure_logging=False)
    yield ray.get_runtime_context().gcs_address
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def pool(cluster):
    """One actor on each of the two logical GPUs, kept for the session: it serves every job,
    sweep and rerun of the Ray tests (each actor started costs a process that imports torch
    and TransformerLens, about 8 CPU-seconds)."""
    from tl_reward.scale import RayExecutor

    with RayExecutor(num_gpus=1, **HALF).session() as p:
        yield p


# -- the single-process references of the faithfulness, probe and Grams jobs ---------------
@pytest.fixture(scope="session")
def job_models(tmp_path_factory) -> dict[str, Any]:
    """Three tiny seeded reward models saved to disk (what workers load) and loaded here."""
    from tl_reward import HookedRewardModel
    from tl_reward.testing.tiny import save_tiny_reward_model

    root = tmp_path_factory.mktemp("job_rms")
    paths = {"llama": save_tiny_reward_model(root / "llama", "llama", num_labels=2, seed=3),
             "qwen2": save_tiny_reward_model(root / "qwen2", "qwen2", seed=4),
             "llama1": save_tiny_reward_model(root / "llama1", "llama", seed=5)}
    cfg = json.loads((paths["llama"] / "config.json").read_text())
    cfg["max_position_embeddings"] = 1024  # room for the published probes' longer texts
    (paths["llama"] / "config.json").write_text(json.dumps(cfg))
    return {a: (str(p), HookedRewardModel.from_pretrained(str(p), device="cpu"))
            for a, p in paths.items()}


@pytest.fixture(scope="session")
def references(job_models) -> dict[str, Any]:
    """The single-process results every executor must reproduce exactly."""
    from tl_reward.analysis.faithfulness import faithfulness_report
    from tl_reward.audit.probes import run_probes
    from tl_reward.compare.layers import layer_grams

    a, b = job_models["llama"][1], job_models["qwen2"][1]
    return one_thread(lambda: {
        "faith": faithfulness_report(a, PAIRS, "head", progress=False),
        "probes": run_probes(a, ITEMS, DIMS, progress=False, **PROBE_KW),
        "grams_pooled": [layer_grams(m, INPUTS, **GRAM_KW) for m in (a, b)],
        "grams_response": layer_grams(a, INPUTS, positions="response", layer_chunk=2,
                                      **GRAM_KW),
    })
