"""Loading: offline, errors that name the fix, registry extension, weight processing."""

from __future__ import annotations

import socket

import pytest
import torch
from helpers import CONVERSATIONS, hf_rewards, parity_atol

from tl_reward import Architecture, HookedRewardModel, register_architecture
from tl_reward.architectures import supported_architectures
from tl_reward.architectures.llama import llama_config
from tl_reward.errors import (
    MissingPadTokenError,
    TokenizerMismatchError,
    UnknownObjectiveError,
    UnsupportedArchitectureError,
)
from tl_reward.testing import save_tiny_reward_model, tiny_hf_reward_model, tiny_tokenizer
from tl_reward.tl_backend import tl_converter


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_local_directory_and_memory_loads_make_no_network_call(tmp_path, no_network) -> None:
    path = save_tiny_reward_model(tmp_path / "rm", "qwen2")
    model = HookedRewardModel.from_pretrained(str(path), device="cpu")
    hf, tok = tiny_hf_reward_model("gemma2")
    HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")
    assert model.cfg.n_ctx == 256  # taken from the HF config


def test_unsupported_architecture_lists_supported_and_how_to_register() -> None:
    from transformers import BertConfig, BertForSequenceClassification

    hf = BertForSequenceClassification(BertConfig(vocab_size=64, hidden_size=32,
                                                  num_hidden_layers=1, num_attention_heads=2,
                                                  intermediate_size=32))
    with pytest.raises(UnsupportedArchitectureError) as err:
        HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tiny_tokenizer(), device="cpu")
    msg = str(err.value)
    assert "BertForSequenceClassification" in msg and "register_architecture" in msg
    assert all(a in msg for a in supported_architectures())


def test_user_registered_architecture_loads() -> None:
    from transformers import LlamaForSequenceClassification

    class MyRewardModel(LlamaForSequenceClassification):
        pass

    register_architecture(Architecture(hf_class="MyRewardModel", config=llama_config,
                                       convert=tl_converter("llama")), overwrite=True)
    hf, tok = tiny_hf_reward_model("llama", seed=5)
    mine = MyRewardModel(hf.config)
    mine.load_state_dict(hf.state_dict())
    mine.eval()
    model = HookedRewardModel.from_pretrained(hf_model=mine, tokenizer=tok, device="cpu")
    batch = model.make_batch(CONVERSATIONS)
    with torch.no_grad():
        ours = model(batch.tokens, attention_mask=batch.attention_mask, return_type="reward")
    ref = hf_rewards(mine, batch.tokens, batch.attention_mask)["reward"]
    torch.testing.assert_close(ours, ref, atol=parity_atol(ref, model.cfg.n_layers), rtol=0)


def test_missing_pad_token_refuses_to_batch() -> None:
    hf, tok = tiny_hf_reward_model("gpt2")
    hf.config.pad_token_id = None
    tok.pad_token = None
    model = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")
    assert model.pad_token_id is None
    with pytest.raises(MissingPadTokenError, match="pad"):
        model.rewards(CONVERSATIONS, batch_size=3)
    one = model.rewards(CONVERSATIONS[0])  # a single sequence needs no padding
    assert one.rewards.shape == (1, 1)


def test_tokenizer_vocabulary_mismatch() -> None:
    hf, tok = tiny_hf_reward_model("llama")
    tok.add_tokens([f"extra{i}" for i in range(200)])
    with pytest.raises(TokenizerMismatchError, match="does not belong"):
        HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")


def test_token_ids_outside_vocabulary(tiny) -> None:
    model, _, _ = tiny("llama")
    with pytest.raises(TokenizerMismatchError, match="vocabulary"):
        model.rewards([[1, 2, model.cfg.d_vocab + 3]])


def test_unknown_objective(tiny) -> None:
    model, _, _ = tiny("llama", 3)
    with pytest.raises(UnknownObjectiveError, match="objective_0"):
        model.objective_index("helpfulness")
    with pytest.raises(UnknownObjectiveError, match="out of range"):
        model.objective_index(7)
    with pytest.raises(UnknownObjectiveError, match="no combined score"):
        model.reward_direction("score")
    armo, _, _ = tiny("armorm", 5)
    assert armo.objective_index("objective_2") == 2


def test_head_is_folded_never_centred_and_gemma_softcap_off(tiny) -> None:
    model, hf, _ = tiny("llama")
    gain = hf.model.norm.weight.detach()
    torch.testing.assert_close(model.W_U[:, 0], hf.score.weight[0].detach() * gain)
    assert model.W_U.abs().sum() > 0
    gemma, hf_g, _ = tiny("gemma2")
    assert gemma.cfg.output_logits_soft_cap <= 0
    assert hf_g.config.final_logit_softcapping == 3.0
    assert gemma.cfg.attn_scores_soft_cap == 5.0


def test_objective_names_from_id2label() -> None:
    hf, tok = tiny_hf_reward_model("llama", num_labels=2)
    hf.config.id2label = {0: "helpful", 1: "harmless"}
    model = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")
    assert model.objectives == ["helpful", "harmless"]
    assert model.objective_index("harmless") == 1
