"""Inputs shared by the tests of the faithfulness, probe and Grams jobs (tests/scale), and
exact-equality checks against their single-process results."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tl_reward.audit.perturbations import user_items
from tl_reward.data import PreferencePair

PAIRS = [PreferencePair.from_prompt(p, c, r) for p, c, r in [
    ("Is the sky blue?", "Yes, the sky is blue.", "No, it is red."),
    ("hi", "Hello! How can I help?", "Go away."),
    ("What is love?", "Love. Friendship. Music.", "Hate. War."),
    ("Can cats swim?", "Most can, few enjoy it.", "No."),
    ("hi", "Same.", "Same."),  # margin exactly 0: skipped, listed in meta
    ("Is coffee healthy?", "In moderation it is fine.", "Drink ten cups."),
    ("Why do leaves fall?", "Trees shed them in autumn.", "Because."),
    ("What is rust?", "Iron oxide.", "A colour."),
    ("How far is the moon?", "About 384,000 km.", "Close."),
    ("Name a prime.", "Seven.", "Eight."),
]]
ITEMS = user_items([
    ("Why is the sky blue?", "Sunlight scatters off air. Blue light scatters most."),
    ("How do I boil an egg?", "Put it in boiling water. Wait nine minutes."),
    ("What is a prime number?", "A number with exactly two divisors. Seven is one."),
    ("Can cats swim?", "Most cats can swim. Few of them enjoy it."),
    ("Is coffee healthy?", "In moderation it is fine. Too much can disturb sleep."),
    ("Why do leaves fall?", "Trees shed them in autumn. This saves water."),
    ("What is rust?", "Iron oxide. It forms when iron meets water and air."),
    ("How far is the moon?", "About 384,000 kilometres. Light needs a second."),
    ("Who wrote Hamlet?", "Shakespeare wrote it. It was first staged around 1600."),
    ("What do bees make?", "Bees make honey. They also make wax."),
])
DIMS = ["length", "flattery", "formatting", "sycophancy"]
PROBE_KW = {"chunk_size": 2, "n_permutations": 4995, "seed": 1}
_rng = np.random.default_rng(0)
_WORDS = "the sky is blue red green cats swim well rarely coffee helps sleep badly".split()
# 37 inputs of varied length: 8 batches of 5 (the last short)
INPUTS = [(" ".join(_rng.choice(_WORDS, 3)),
           " ".join(_rng.choice(_WORDS, int(_rng.integers(1, 12))))) for _ in range(37)]
GRAM_KW = {"batch_size": 5}
#: Half a CPU per actor: the session's pool (2 actors) and a crashing pool (2) fit on 2 CPUs.
HALF = {"num_cpus": 0.5, "threads": 1}


#: What a killed driver imports before its job: preloaded once by the forkserver of
#: :func:`killed_driver` (a fresh process would import them again each time, about 8 s).
DRIVER_PRELOAD = ["torch", "transformer_lens", "tl_reward.scale", "tl_reward.analysis.faithfulness",
                  "tl_reward.audit.probes", "tl_reward.compare.layers", "scale_jobs"]


def killed_driver(target: Any, *args: Any, timeout: float = 300) -> int:
    """Run ``target(*args)`` as a driver process of its own, forked from a server process
    that imported :data:`DRIVER_PRELOAD` once (``multiprocessing``'s ``forkserver``: a clean
    single-threaded parent, not this one) with this process's current environment, as a
    subprocess would have it, and return its exit code:
    ``-SIGKILL`` when it killed itself as planned."""
    import multiprocessing
    import os

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(DRIVER_PRELOAD)
    proc = ctx.Process(target=_in_environment, args=(dict(os.environ), target, *args))
    proc.start()
    proc.join(timeout)
    if proc.exitcode is None:
        proc.kill()
        proc.join()
        raise TimeoutError(f"the driver ran past {timeout} s")
    return proc.exitcode


def _in_environment(env: dict[str, str], target: Any, *args: Any) -> None:
    import os

    os.environ.clear()
    os.environ.update(env)
    target(*args)


def sigkill_after(k: int) -> Any:
    """A job callback that SIGKILLs this process at its ``k``-th call: no cleanup, no
    ``finally``."""
    import os
    import signal

    seen: list[Any] = []

    def die(*args: Any) -> None:
        seen.append(args)
        if len(seen) == k:
            os.kill(os.getpid(), signal.SIGKILL)
    return die


def drive_job(job: str, path: str, out: str) -> None:
    """A driver of the faithfulness, probe or Grams job that dies after 3 finished units."""
    from tl_reward.scale import LocalExecutor, run_faithfulness, run_layer_grams, run_probes

    torch.set_num_threads(1)
    ex, die = LocalExecutor(threads=1), sigkill_after(3)
    if job == "faith":
        run_faithfulness(path, PAIRS, "head", cache_dir=out, executor=ex, pairs_per_unit=2,
                         progress=False, callback=die)
    elif job == "probes":
        run_probes(path, ITEMS, DIMS, output_dir=out, executor=ex, progress=False,
                   on_chunk=die, **PROBE_KW)
    else:
        run_layer_grams(path, INPUTS, cache_dir=out, executor=ex, batches_per_unit=2,
                        progress=False, callback=die, **GRAM_KW)


def one_thread(fn: Any) -> Any:
    """Run ``fn()`` with 1 torch thread (the workers' count: same reductions, same bits)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(threads)


def assert_same_faithfulness(got: Any, ref: Any) -> None:
    """Exactly the single-process report: every tensor, id, name and skipped pair."""
    assert got.names == ref.names and got.pair_ids == ref.pair_ids and got.meta == ref.meta
    assert got.scores.keys() == ref.scores.keys()
    for k in ref.scores:
        assert torch.equal(got.scores[k], ref.scores[k]), k
    assert torch.equal(got.deltas, ref.deltas)


def assert_same_probes(got: Any, ref: Any) -> None:
    import pandas as pd

    pd.testing.assert_frame_equal(got.rows, ref.rows, check_exact=True)
    assert got.to_dataframe().equals(ref.to_dataframe())
    assert got.model_fingerprint == ref.model_fingerprint


def assert_same_grams(got: Any, ref: Any) -> None:
    assert got.hooks == ref.hooks and got.model == ref.model and got.positions == ref.positions
    assert np.array_equal(got.row_item, ref.row_item)
    assert np.array_equal(got.grams, ref.grams)  # bit for bit


def assert_same_behaviour(got: Any, ref: Any) -> None:
    """Exactly ``compare_models``' result: names, rewards, every statistic, readability fits."""
    import pandas as pd

    assert got.models == ref.models and got.rewards.keys() == ref.rewards.keys()
    for n in ref.rewards:
        assert np.array_equal(got.rewards[n], ref.rewards[n]), n
    pd.testing.assert_frame_equal(got.to_dataframe(), ref.to_dataframe(), check_exact=True)
    for g, r in zip(got.readability, ref.readability, strict=True):
        assert (g.source, g.target, g.hook) == (r.source, r.target, r.hook)
        assert np.array_equal(g.predicted, r.predicted)
