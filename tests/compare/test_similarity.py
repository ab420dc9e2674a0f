"""RV, RV2, linear and debiased CKA against hoggorm, Song et al.'s unbiased HSIC and simulation."""

from __future__ import annotations

import hoggorm
import numpy as np
import pytest
import torch

from tl_reward.compare.similarity import (
    debiased_cka,
    linear_cka,
    permutation_test,
    rv,
    rv2,
)
from tl_reward.errors import TLRewardError

# float64 throughout; every quantity is a cosine of order 1, so 1e-10 leaves room for the
# O(n^2 p) summation error (~1e-13) while catching any formula slip (>= 1e-3 on these data).
TOL = 1e-10


def _data(n: int, p: int, q: int, seed: int, shared: float = 0.5, offset: float = 3.0):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, 3))
    x = z @ rng.normal(size=(3, p)) + rng.normal(size=(n, p)) + offset
    y = shared * z @ rng.normal(size=(3, q)) + rng.normal(size=(n, q)) - offset
    return x, y


def song_unbiased_hsic(k: np.ndarray, l: np.ndarray) -> float:  # noqa: E741
    """Song et al. (2012) eq. 5, written from the paper: with zero-diagonal K~, L~,
    HSIC_1 = [tr(K~L~) + 1'K~1 1'L~1 / ((n-1)(n-2)) - 2/(n-2) 1'K~L~1] / (n(n-3))."""
    n = k.shape[0]
    kt, lt = k - np.diag(np.diag(k)), l - np.diag(np.diag(l))
    one = np.ones(n)
    return float((np.trace(kt @ lt) + (one @ kt @ one) * (one @ lt @ one) / ((n - 1) * (n - 2))
                  - 2.0 / (n - 2) * (one @ kt @ lt @ one)) / (n * (n - 3)))


def reference_debiased_cka(x: np.ndarray, y: np.ndarray) -> float:
    k, l = x @ x.T, y @ y.T  # noqa: E741 - raw linear kernels: the estimator needs no centring
    return song_unbiased_hsic(k, l) / np.sqrt(song_unbiased_hsic(k, k) * song_unbiased_hsic(l, l))


@pytest.mark.parametrize("n,p,q", [(12, 5, 7), (30, 200, 40), (8, 3, 3)])
def test_rv2_equals_hoggorm_on_centred_data(n, p, q):
    x, y = _data(n, p, q, seed=n)
    xc, yc = x - x.mean(0), y - y.mean(0)
    ref = hoggorm.RV2coeff([xc, yc])[0, 1]
    assert abs(rv2(x, y) - ref) < TOL
    assert abs(rv(x, y) - hoggorm.RVcoeff([xc, yc])[0, 1]) < TOL
    # hoggorm does not centre: our uncentred RV2 matches it on raw data, and differs from the
    # centred value by far more than TOL (the offset of 3 drives the raw value toward 1)
    assert abs(rv2(x, y, centre=False) - hoggorm.RV2coeff([x, y])[0, 1]) < TOL
    assert abs(rv2(x, y, centre=False) - ref) > 1e-3


def test_linear_cka_equals_rv_on_centred_data():
    x, y = _data(25, 40, 9, seed=1)
    assert abs(linear_cka(x, y) - rv(x, y)) < TOL
    # ... but not the RV of the raw matrices (the identity needs the centring)
    assert abs(linear_cka(x, y) - rv(x, y, centre=False)) > 1e-3


@pytest.mark.parametrize("n,p,q", [(10, 4, 6), (40, 300, 20)])
def test_debiased_cka_equals_song_unbiased_hsic(n, p, q):
    x, y = _data(n, p, q, seed=p)
    ref = reference_debiased_cka(x, y)
    assert abs(debiased_cka(x, y) - ref) < TOL
    # the biased estimator (plain linear CKA) is a different number on these data
    assert abs(linear_cka(x, y) - ref) > 1e-3
    # invariant to column means (U-centring removes them), unlike uncentred RV2
    assert abs(debiased_cka(x + 100.0, y - 50.0) - ref) < 1e-8


def test_torch_and_numpy_inputs_agree_and_bad_input_is_named():
    x, y = _data(12, 6, 5, seed=2)
    xt = torch.tensor(x, dtype=torch.float32)
    # float32 input, float64 inside: differences are float32 rounding of the inputs (~1e-7)
    assert abs(debiased_cka(xt, torch.tensor(y)) - debiased_cka(x.astype(np.float32), y)) < 1e-12
    assert abs(rv2(xt, y) - rv2(x, y)) < 1e-5
    with pytest.raises(TLRewardError, match="same items"):
        rv(x, y[:-1])
    with pytest.raises(TLRewardError, match="NaN"):
        rv(np.full((5, 2), np.nan), y[:5])


def test_simulation_debiased_cka_near_zero_where_rv2_is_not():
    """methods.md section 8: independent Gaussian data, n = 20, p = q = 4096."""
    rng = np.random.default_rng(0)
    d_vals, r2_vals = [], []
    for _ in range(10):
        x, y = rng.normal(size=(20, 4096)), rng.normal(size=(20, 4096))
        d_vals.append(debiased_cka(x, y))
        r2_vals.append(rv2(x, y))
    # means over 10 draws; one draw's debiased CKA has SD ~0.05 here (measured), the mean ~0.017
    assert abs(np.mean(d_vals)) < 0.05
    assert np.mean(r2_vals) > 0.85  # measured 0.92 (the spec's number)
    # and the small-p regime where RV2 is fine (spec: 0.002 at n = 50, p = 10)
    r2_small = [rv2(rng.normal(size=(50, 10)), rng.normal(size=(50, 10))) for _ in range(20)]
    assert abs(np.mean(r2_small)) < 0.05


def test_permutation_fast_path_equals_permuting_rows():
    """Each test's null against a brute force: Y's rows permuted by the documented draws
    (``default_rng(seed).permutation(n)``, B times) and each statistic from hoggorm / Song et
    al.'s formula; p-value, null mean and excess from that null."""
    x, y = _data(15, 8, 6, seed=3)
    xc, yc = x - x.mean(0), y - y.mean(0)
    refs = {"rv2": lambda a, b: hoggorm.RV2coeff([a - a.mean(0), b - b.mean(0)])[0, 1],
            "rv": lambda a, b: hoggorm.RVcoeff([a - a.mean(0), b - b.mean(0)])[0, 1],
            "debiased_cka": reference_debiased_cka}
    for measure, ref in refs.items():
        fast = permutation_test(measure, x, y, n_permutations=50, seed=7)
        rng = np.random.default_rng(7)
        null = np.array([ref(xc, yc[rng.permutation(15)]) for _ in range(50)])
        obs = ref(xc, yc)
        np.testing.assert_allclose(fast.null, null, atol=TOL)
        assert fast.observed == pytest.approx(obs, abs=TOL)
        assert fast.p_value == (1 + (null >= obs - 1e-12).sum()) / 51
        assert null.std() > 1e-3  # the permutations move the statistic
        df = fast.to_dataframe()
        assert df.loc[0, "null_mean"] == pytest.approx(null.mean(), abs=TOL)
        assert df.loc[0, "excess"] == pytest.approx(obs - null.mean(), abs=TOL)
        assert df.loc[0, "null_sd"] == pytest.approx(null.std(ddof=1), abs=TOL)
    # a user's function gets the same permutations
    slow = permutation_test(rv2, x, y, n_permutations=50, seed=7)
    np.testing.assert_allclose(slow.null, permutation_test("rv2", x, y, 50, 7).null, atol=TOL)
    fig = fast.plot()  # the histogram is of this null
    np.testing.assert_allclose(np.sort(fig.data[0].x), np.sort(fast.null))


def test_permutation_p_values_calibrated_under_the_null_and_powerful_under_dependence():
    rng = np.random.default_rng(11)
    sims, b = 400, 99
    ps = np.array([permutation_test("rv2", rng.normal(size=(10, 4)), rng.normal(size=(10, 4)),
                                    n_permutations=b, seed=s).p_value for s in range(sims)])
    share = float((ps <= 0.05).mean())
    # exact level: P(p <= 0.05) = 5/100 for B = 99 (measured 0.050); binomial SD over 400 sims
    # is 0.011, so [0.02, 0.085] is about 3 SD. Permuting X and Y together (pairing never
    # broken) gives p = 1 always, and a null of the wrong statistic (RV's null for an observed
    # RV2, RV >= RV2) gives shares near 0: both fail here.
    assert 0.02 <= share <= 0.085, share
    # the whole null distribution: p is uniform on {1, ..., 100} / 100, so the empirical CDF
    # stays within the DKW band (95 %, 400 draws: 0.068) of k / 100 at every grid point
    grid = np.arange(1, b + 2) / (b + 1)
    np.testing.assert_allclose(ps * (b + 1), np.round(ps * (b + 1)), atol=1e-9)  # on the grid
    ecdf = (ps[None, :] <= grid[:, None] + 1e-12).mean(1)
    assert np.abs(ecdf - grid).max() < np.sqrt(np.log(2 / 0.05) / (2 * sims))
    # dependence is detected
    x, y = _data(20, 10, 10, seed=5, shared=2.0)
    assert permutation_test("debiased_cka", x, y, n_permutations=199, seed=0).p_value <= 0.01
