"""The multi-objective demo RM: loads by name, and its two objectives equal HF's forward with
the shipped heads (an HF classifier built here from the backbone and the raw head file)."""

from __future__ import annotations

import pytest
import torch
from helpers import CONVERSATIONS

from tl_reward import HookedRewardModel
from tl_reward.model.demo import (
    MULTI_HEAD_FILE,
    MULTI_MODEL_NAME,
    MULTI_OBJECTIVES,
    load_demo_head,
    load_multi_head,
    smollm2_local_dir,
)

pytestmark = pytest.mark.slow


def test_multi_objective_demo_by_name() -> None:
    from transformers import AutoTokenizer, LlamaForSequenceClassification

    if not MULTI_HEAD_FILE.exists():
        pytest.skip("multi-objective heads not trained yet")
    model = HookedRewardModel.from_pretrained(MULTI_MODEL_NAME, device="cpu")
    assert model.objectives == list(MULTI_OBJECTIVES) == ["harmlessness", "sentiment"]
    weight, meta = load_multi_head()
    assert weight.shape == (2, model.cfg.d_model)
    assert meta["objectives"] == ["harmlessness", "sentiment"]
    assert meta["sentiment"]["target"].startswith("VADER compound score of the assistant reply")
    # the harmlessness row is the packaged demo head, verbatim
    torch.testing.assert_close(weight[0], load_demo_head()[0][0])
    with pytest.raises(Exception, match="no combined score"):
        model.reward_direction("score")

    # independent reference: HF's own classifier with the raw rows as its score layer
    path = smollm2_local_dir()
    tok = AutoTokenizer.from_pretrained(path)
    hf = LlamaForSequenceClassification.from_pretrained(path, num_labels=2, dtype=torch.float32)
    with torch.no_grad():
        hf.score.weight.copy_(weight)
    hf.config.pad_token_id = tok.pad_token_id
    batch = model.make_batch(CONVERSATIONS)
    with torch.no_grad():
        ours = model(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")
        ref = hf.eval()(input_ids=batch.tokens, attention_mask=batch.attention_mask).logits
    assert ref.abs().max() > 0.05
    # float32 through 30 layers, rewards of order 1: 1e-4 absolute (the project's parity bar)
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)
