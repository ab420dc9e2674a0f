"""Resampling statistics against scipy: ranks, Spearman, sign-flip p-values."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from tl_reward.stats.paired import sign_flip_test
from tl_reward.stats.ranks import average_ranks
from tl_reward.stats.resampling import spearman


def test_ranks_and_spearman_match_scipy() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(0, 5, (4, 12), generator=gen).double()  # many ties
    b = torch.randn(4, 12, generator=gen, dtype=torch.float64)
    for i in range(4):
        np.testing.assert_array_equal(average_ranks(a[i]), stats.rankdata(a[i].numpy()))
    np.testing.assert_array_equal(average_ranks(a), stats.rankdata(a.numpy(), axis=-1))
    rho = spearman(a, b)
    ref = [stats.spearmanr(a[i].numpy(), b[i].numpy()).statistic for i in range(4)]
    np.testing.assert_allclose(rho.numpy(), ref, atol=1e-12)
    assert torch.isnan(spearman(torch.ones(5), torch.arange(5.0)))


def test_spearman_memory_is_linear_in_the_number_of_values() -> None:
    # main built [..., C, C] masks: 4 x 200,000^2 bools = 160 GB here. O(C): a few [4, C] arrays
    # of float64 / int64 (6.4 MB each); numpy reports its buffers to tracemalloc
    import tracemalloc
    rng = np.random.default_rng(0)
    a = torch.from_numpy(rng.integers(0, 1000, size=(4, 200_000)).astype(np.float64))  # ties
    b = torch.from_numpy(rng.normal(size=(4, 200_000)))
    tracemalloc.start()
    try:
        rho = spearman(a, b)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * a.numel() * 8  # 128 MB: linear; quadratic would be 1e5 times more
    ref = [stats.spearmanr(a[i].numpy(), b[i].numpy()).statistic for i in range(4)]
    np.testing.assert_allclose(rho.numpy(), ref, atol=1e-12)


def test_sign_flip_p_matches_scipy_exact() -> None:
    x = np.array([0.31, -0.12, 0.44, 0.05, 0.27, -0.03, 0.19, 0.38, 0.11, -0.21])
    ref = stats.permutation_test((x,), lambda v, axis: np.mean(v, axis=axis),
                                 permutation_type="samples", n_resamples=np.inf,
                                 alternative="two-sided").pvalue
    assert sign_flip_test(x).p_value == pytest.approx(ref, abs=1e-12)
    # Monte Carlo path agrees with the exact value
    assert sign_flip_test(x, exact_max_n=4, n_permutations=20_000).p_value == pytest.approx(
        ref, abs=0.01)
