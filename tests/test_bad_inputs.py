"""Every bad input a new user might try gets the library's own error naming the problem and the
fix. One case per line: ``(description, callable(env), error class, message fragment)``; add a
line for each new check. The error must be a ``TLRewardError`` (never a raw ``IndexError``,
``ValueError`` from transformers, or a silent success)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
import torch

from tl_reward import HookedRewardModel
from tl_reward.analysis.attribution import differential_attribution, direct_reward_attribution
from tl_reward.analysis.attribution_patching import attribution_patching
from tl_reward.analysis.direct_path import direct_path_patching
from tl_reward.analysis.lens import reward_lens
from tl_reward.analysis.patching import activation_patching
from tl_reward.data import PreferencePair
from tl_reward.errors import (
    ContextLengthError,
    EmptyResponseError,
    MissingPadTokenError,
    MissingTokenizerError,
    TLRewardError,
    TokenizerMismatchError,
    UnknownObjectiveError,
    UnsupportedArchitectureError,
)
from tl_reward.model.scoring import score_pairs
from tl_reward.planted import (
    plant_implicit_reward,
    plant_objectives,
    plant_shared_prefix,
    plant_trigger_head,
)
from tl_reward.sae.pretrained import load_sae
from tl_reward.sweep.vocab_sweep import score_vocabulary
from tl_reward.testing import tiny_hf_reward_model
from tl_reward.testing.tiny import tiny_tokenizer

PAIR = ("Is the sky blue?", "Yes, on a clear day.", "No.")
CONV = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}]


class Env:
    """Models and results the cases need, each built on first use."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp

    @cached_property
    def model(self) -> HookedRewardModel:  # K = 2 objectives, no combined score
        hf, tok = tiny_hf_reward_model("llama", num_labels=2, seed=0)
        return HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")

    @cached_property
    def no_pad(self) -> HookedRewardModel:
        hf, tok = tiny_hf_reward_model("gpt2")
        hf.config.pad_token_id = None
        tok.pad_token = None
        return HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu")

    @cached_property
    def checkpoint(self) -> Path:
        """A directory with config and weights but no tokenizer files (what most training
        scripts save); Llama's used to fail with "Couldn't instantiate the backend tokenizer"."""
        hf, _ = tiny_hf_reward_model("llama", seed=0)
        path = self.tmp / "ckpt"
        hf.save_pretrained(path)
        return path

    @cached_property
    def tokenizerless(self) -> HookedRewardModel:
        with pytest.warns(UserWarning, match="tokenizer="):
            return HookedRewardModel.from_pretrained(str(self.checkpoint), device="cpu")

    @cached_property
    def hf(self) -> Any:  # (HF Llama reward model, tokenizer)
        return tiny_hf_reward_model("llama", seed=0)

    @cached_property
    def lm(self) -> Any:  # (HF Llama causal LM, tokenizer)
        from tl_reward.testing.causal import tiny_causal_lm

        return tiny_causal_lm("llama", 0)

    @cached_property
    def dra(self) -> Any:
        return direct_reward_attribution(self.model, [PAIR[:2]], objectives=[0, 1])

    @cached_property
    def lens(self) -> Any:
        return reward_lens(self.model, [PAIR[:2]], objectives=[0, 1])


def _bert() -> Any:
    from transformers import BertConfig, BertForSequenceClassification

    return BertForSequenceClassification(BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32))


def _big_tokenizer() -> Any:
    tok = tiny_tokenizer()
    tok.add_tokens([f"extra{i}" for i in range(200)])
    return tok


Case = tuple[str, Callable[[Env], Any], type[Exception], str]
CASES: list[Case] = [
    ("unsupported architecture", lambda e: HookedRewardModel.from_pretrained(hf_model=_bert(), tokenizer=tiny_tokenizer(), device="cpu"), UnsupportedArchitectureError, "register_architecture"),  # noqa: E501
    ("missing pad token for a batch", lambda e: e.no_pad.rewards([CONV, PAIR[:2]], batch_size=2), MissingPadTokenError, "pad_token"),  # noqa: E501
    ("sequence longer than the context", lambda e: e.model.rewards([("hi", "Yes. " * 300)]), ContextLengthError, "shorten"),  # noqa: E501
    ("tokenizer of another model", lambda e: HookedRewardModel.from_pretrained(hf_model=tiny_hf_reward_model("llama")[0], tokenizer=_big_tokenizer(), device="cpu"), TokenizerMismatchError, "load the one saved with it"),  # noqa: E501
    ("too long reply, named by its place in the inputs (not its batch row)", lambda e: e.model.rewards([PAIR[:2], ("hi", "Yes. " * 300), PAIR[:2]], batch_size=1), ContextLengthError, "input 1 has"),  # noqa: E501
    ("too long reply of a pair, named by the pair and its side", lambda e: score_pairs(e.model, [PreferencePair.from_prompt(*PAIR), PreferencePair.from_prompt("hi", "ok", "Yes. " * 300)]), ContextLengthError, "pair 1 (rejected reply) has"),  # noqa: E501
    ("too long reply of a patched pair (was an IndexError)", lambda e: activation_patching(e.model, ("hi", "Yes. " * 300, "No."), "mlp_out", objective=0), ContextLengthError, "pair 0 (chosen reply) has"),  # noqa: E501
    ("token id outside the vocabulary", lambda e: e.model.rewards([[1, 2, e.model.cfg.d_vocab]]), TokenizerMismatchError, "tokenizer saved with"),  # noqa: E501
    ("empty response", lambda e: e.model.rewards([("hi", "  ")]), EmptyResponseError, "non-empty"),  # noqa: E501
    ("empty reply of a pair (the loader's option is the fix)", lambda e: PreferencePair.from_prompt("hi", "ok", " "), EmptyResponseError, "rejected response is empty; every pair needs two non-empty replies (drop the pair, or pass skip_invalid=True to the loader)"),  # noqa: E501
    ("empty assistant turn", lambda e: e.model.rewards([[CONV[0], {"role": "assistant", "content": ""}]]), EmptyResponseError, "non-empty"),  # noqa: E501
    ("unknown objective name (rewards)", lambda e: score_pairs(e.model, [PreferencePair.from_prompt(*PAIR)], objective="helpfulness"), UnknownObjectiveError, "objective_0"),  # noqa: E501
    ("unknown objective name (attribution)", lambda e: direct_reward_attribution(e.model, [PAIR[:2]], objectives="helpfulness"), UnknownObjectiveError, "objective_0"),  # noqa: E501
    ("combined score of a head without one", lambda e: direct_reward_attribution(e.model, [PAIR[:2]], objectives="score"), UnknownObjectiveError, "no combined score"),  # noqa: E501
    ("objective index out of range (rewards)", lambda e: score_pairs(e.model, [PreferencePair.from_prompt(*PAIR)], objective=2), UnknownObjectiveError, "out of range"),  # noqa: E501
    ("objective index out of range (attribution)", lambda e: direct_reward_attribution(e.model, [PAIR[:2]], objectives=5), UnknownObjectiveError, "out of range"),  # noqa: E501
    ("objective index out of range (differential attribution)", lambda e: differential_attribution(e.model, [PAIR], objectives=-3), UnknownObjectiveError, "out of range"),  # noqa: E501
    ("objective index out of range (attribution result)", lambda e: e.dra.top_components(objective=2), UnknownObjectiveError, "out of range"),  # noqa: E501
    ("objective index out of range (attribution plot)", lambda e: e.dra.plot(objective=-3), UnknownObjectiveError, "out of range"),  # noqa: E501
    ("objective name not in the attribution result", lambda e: e.dra.top_components(objective="helpfulness"), UnknownObjectiveError, "objective_0"),  # noqa: E501
    ("objective index out of range (patching)", lambda e: activation_patching(e.model, PAIR, "mlp_out", objective=2), UnknownObjectiveError, "out of range"),  # noqa: E501
    ("objective index out of range (attribution patching)", lambda e: attribution_patching(e.model, PAIR, objective=7), UnknownObjectiveError, "out of range"),  # noqa: E501
    ("objective index out of range (direct path)", lambda e: direct_path_patching(e.model, PAIR, objective=2), UnknownObjectiveError, "out of range"),  # noqa: E501
    ("objective index out of range (lens)", lambda e: reward_lens(e.model, [PAIR[:2]], objectives=2), UnknownObjectiveError, "out of range"),  # noqa: E501
    ("objective index out of range (lens result)", lambda e: e.lens.increments()[..., e.lens._obj(2)], UnknownObjectiveError, "out of range"),  # noqa: E501
    ("objective name not in the lens result", lambda e: e.lens.plot(objective="helpfulness"), UnknownObjectiveError, "objective_0"),  # noqa: E501
    ("boolean objective index", lambda e: direct_reward_attribution(e.model, [PAIR[:2]], objectives=True), UnknownObjectiveError, "out of range"),  # noqa: E501
    ("tokenizer-less checkpoint, text input", lambda e: e.tokenizerless.rewards(["Is the sky blue?"]), MissingTokenizerError, "tokenizer="),  # noqa: E501
    ("tokenizer-less checkpoint, conversation", lambda e: e.tokenizerless.rewards([CONV]), MissingTokenizerError, "tokenizer="),  # noqa: E501
    ("tokenizer-less checkpoint, (prompt, response)", lambda e: e.tokenizerless.rewards([PAIR[:2]]), MissingTokenizerError, "tokenizer="),  # noqa: E501
    ("tokenizer-less checkpoint, preference pair", lambda e: activation_patching(e.tokenizerless, PAIR, "mlp_out"), MissingTokenizerError, "tokenizer="),  # noqa: E501
    ("no model directory", lambda e: HookedRewardModel.from_pretrained(str(e.tmp / "nowhere"), device="cpu"), TLRewardError, "no model directory"),  # noqa: E501
    ("bad pooling rule (loading)", lambda e: HookedRewardModel.from_pretrained(hf_model=tiny_hf_reward_model("gpt2")[0], tokenizer=tiny_tokenizer(), device="cpu", pooling="first"), TLRewardError, "pooling rule"),  # noqa: E501
    ("bad pooling rule (rewards)", lambda e: e.model.rewards([PAIR[:2]], pooling="last"), TLRewardError, "pooling rule"),  # noqa: E501
    ("bad padding side", lambda e: e.model.rewards([PAIR[:2], CONV], padding_side="middle"), TLRewardError, "padding_side"),  # noqa: E501
    ("bad patching mode", lambda e: activation_patching(e.model, PAIR, "mlp_out", "resample", objective=0), TLRewardError, "unknown mode"),  # noqa: E501
    ("bad patching site", lambda e: activation_patching(e.model, PAIR, "attn_scores", objective=0), TLRewardError, "unknown site"),  # noqa: E501
    ("mean ablation without a reference", lambda e: activation_patching(e.model, PAIR, "mlp_out", "mean", objective=0), TLRewardError, "reference="),  # noqa: E501
    ("bad direct-path mode", lambda e: direct_path_patching(e.model, PAIR, mode="sideways", objective=0), TLRewardError, "mode"),  # noqa: E501
    ("sweep prompt longer than the context", lambda e: score_vocabulary(e.model, "word " * 300, ids=[5]), ContextLengthError, "prompt 'prompt_0' with a one-token reply"),  # noqa: E501
    ("SAE folder that does not exist", lambda e: load_sae(e.model, str(e.tmp / "no_sae")), TLRewardError, "not a saved SAE folder"),  # noqa: E501
    ("planted trigger in a block out of range", lambda e: plant_trigger_head(*e.hf, "the", layer=7), TLRewardError, "layer must lie in [-3, 3)"),  # noqa: E501
    ("planted trigger in a head out of range", lambda e: plant_trigger_head(*e.hf, "the", head=4), TLRewardError, "head must lie in [0, 4)"),  # noqa: E501
    ("planted trigger on an objective out of range", lambda e: plant_trigger_head(*e.hf, "the", objective=1), TLRewardError, "objective must lie in [0, 1)"),  # noqa: E501
    ("planted trigger id outside the vocabulary", lambda e: plant_trigger_head(*e.hf, 10**6), TLRewardError, "trigger id must lie in"),  # noqa: E501
    ("planted objective correlation above 1", lambda e: plant_objectives(*e.hf, {"a": 1.5}), TLRewardError, "correlation must lie in [-1, 1]"),  # noqa: E501
    ("planted prefix past the last block", lambda e: plant_shared_prefix(*e.hf, k=3), TLRewardError, "k must lie in [0, 3)"),  # noqa: E501
    ("more planted implicit tokens than plain ids", lambda e: plant_implicit_reward(*e.lm, n_tokens=10**5), TLRewardError, "n_tokens must lie in [1,"),  # noqa: E501
    ("planted implicit span of 0", lambda e: plant_implicit_reward(*e.lm, span=0), TLRewardError, "span and beta must be positive"),  # noqa: E501
]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    return Env(tmp_path_factory.mktemp("bad_inputs"))


@pytest.mark.parametrize(("what", "call", "error", "fragment"), CASES,
                         ids=[c[0] for c in CASES])
def test_bad_input_gets_a_clear_error(env: Env, what: str, call: Callable[[Env], Any],
                                      error: type[Exception], fragment: str) -> None:
    assert issubclass(error, TLRewardError)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(error, match=re.escape(fragment)):
            call(env)


def test_tokenizerless_checkpoint_scores_token_ids_like_hf(env: Env) -> None:
    """The checkpoint without tokenizer files loads (with a warning) and scores token ids exactly
    as HF's own forward does."""
    from transformers import AutoModelForSequenceClassification

    model = env.tokenizerless
    assert model.tokenizer is None
    hf = AutoModelForSequenceClassification.from_pretrained(env.checkpoint).eval()
    tok = tiny_tokenizer()
    ids = tok.apply_chat_template([*CONV], tokenize=True, return_dict=True)["input_ids"]
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([ids])).logits
    # float32 rewards of order 1 through 3 tiny layers: 1e-5 is ~100x the rounding noise
    torch.testing.assert_close(model.rewards([ids]).rewards, ref, atol=1e-5, rtol=0)
