"""The packaged VADER policy/reference pair (real SmolLM2 backbone)."""

from __future__ import annotations

import pytest
import torch
from helpers import smollm2_unavailable

from tl_reward.irm.implicit import implicit_rewards
from tl_reward.irm.policy import VADER_ADAPTER_FILE, load_vader_pair, vader_adapter_metadata

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hf_pair():
    assert VADER_ADAPTER_FILE.exists(), "the VADER adapter ships with the package"
    if (reason := smollm2_unavailable()) is not None:
        pytest.skip(reason)
    return load_vader_pair(backend="hf", return_tokenizer=True)


def test_adapter_metadata_and_size():
    assert VADER_ADAPTER_FILE.exists(), "the VADER adapter ships with the package"
    meta = vader_adapter_metadata()
    for key in ("beta", "steps", "n_train_pairs", "train_wall_seconds", "data", "r", "alpha"):
        assert key in meta
    assert VADER_ADAPTER_FILE.stat().st_size < 4_000_000


def test_policy_differs_and_tl_matches_hf(hf_pair):
    policy, reference, tok = hf_pair
    from tl_reward.model.inputs import encode

    ids = torch.tensor([encode(tok, ("How was your day?", "Fine, thanks.")).ids])
    with torch.no_grad():
        lp, lr = policy(input_ids=ids).logits, reference(input_ids=ids).logits
    assert (lp - lr).abs().max() > 1e-2  # the adapter moved the policy
    from tl_reward.irm.models import hooked_causal_lm

    tl = hooked_causal_lm(policy, tok)
    with torch.no_grad():
        got = tl(ids.long()).float()
    # float32 135M model: TransformerLens's folded weights differ by rounding (~1e-4 of logits
    # of size ~20); compare log-probs, which centring the unembedding leaves unchanged
    torch.testing.assert_close(got.log_softmax(-1), lp.log_softmax(-1), atol=2e-3, rtol=0)
    items = [("How was your day?", "It was wonderful, thank you!")]
    r_hf = implicit_rewards(policy, reference, items, 0.1, tokenizer=tok).rewards
    r_tl = implicit_rewards(tl, hooked_causal_lm(reference, tok), items, 0.1).rewards
    torch.testing.assert_close(r_tl, r_hf, atol=2e-3, rtol=1e-3)
