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
