"""Implicit rewards of a tuned policy against its reference (DPO's identity).

``r(x, y) = beta * sum_t [log pi(y_t | x, y_<t) - log pi_ref(y_t | x, y_<t)]`` summed over the
response tokens only: every token of the final assistant turn, the chat template's closing
tokens included (e.g. ``<|im_end|>``), and no prompt token. Works for any pair of causal LMs
sharing a tokenizer, as TransformerLens ``HookedTransformer`` or HF ``*ForCausalLM`` models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float, Int

from tl_reward.errors import TLRewardError
from tl_reward.irm.models import is_hooked, model_device, vocab_size
from tl_reward.model.inputs import EncodedInput, RewardBatch, RewardInput, collate, encode
from tl_reward.results import ShortRepr


@dataclass(repr=False)
class ImplicitRewardResult(ShortRepr):
    """Implicit rewards of a batch of responses, with each response token's contribution.

    Attributes:
        rewards: ``[n]`` float32, ``beta * sum_t (log pi - log pi_ref)`` over response tokens.
        policy_logprobs / reference_logprobs: per item, ``[n_response_tokens]`` float32 log-probs
            of each response token under the policy / the reference.
        response_ids: per item, the response token ids (what was scored).
        tokens: per item, the response tokens as strings (empty when no tokenizer).
        beta: the DPO temperature.
    """

    rewards: Float[torch.Tensor, " n"]
    policy_logprobs: list[Float[torch.Tensor, " t"]]
    reference_logprobs: list[Float[torch.Tensor, " t"]]
    response_ids: list[list[int]]
    tokens: list[list[str]]
    beta: float

    def __len__(self) -> int:
        return int(self.rewards.shape[0])

    def contributions(self, i: int) -> Float[torch.Tensor, " t"]:
        """Item ``i``'s per-token terms ``beta * (log pi - log pi_ref)``; they sum to its reward."""
        return self.beta * (self.policy_logprobs[i] - self.reference_logprobs[i])

    def to_dataframe(self) -> pd.DataFrame:
        """One row per response token: item, position in the response, token, log-probs,
        contribution and the item's reward."""
        return pd.concat([pd.DataFrame({
            "item": i, "position": range(len(ids)), "token_id": ids,
            "token": self.tokens[i] or [""] * len(ids),
            "policy_logprob": self.policy_logprobs[i].cpu().tolist(),
            "reference_logprob": self.reference_logprobs[i].cpu().tolist(),
            "contribution": self.contributions(i).cpu().tolist(),
            "reward": float(self.rewards[i])}) for i, ids in enumerate(self.response_ids)],
            ignore_index=True)

    def plot(self, item: int = 0) -> Any:
        """Bar chart of one item's per-token contributions (plotly)."""
        from tl_reward.viz.irm import plot_token_contributions

        toks = self.tokens[item] or [str(t) for t in self.response_ids[item]]
        return plot_token_contributions(toks, self.contributions(item).cpu().numpy(),
                                        float(self.rewards[item]))


def encode_responses(
    inputs: Sequence[RewardInput | EncodedInput], tokenizer: Any
) -> list[EncodedInput]:
    """Ids and response starts of ``(prompt, response)`` pairs, conversations ending in an
    assistant turn, or ready ``EncodedInput`` items."""
    out = []
    for i, item in enumerate(inputs):
        enc = item if isinstance(item, EncodedInput) else encode(tokenizer, item)
        if enc.response_start is None:
            raise TLRewardError(f"input {i} has no known response start; pass a (prompt, "
                                "response) pair or a conversation ending with an assistant turn "
                                "(or an EncodedInput with response_start)")
        if not 1 <= enc.response_start < len(enc.ids):
            raise TLRewardError(f"input {i}: response_start {enc.response_start} must lie in "
                                f"1..{len(enc.ids) - 1} (the response needs a preceding token "
                                "and at least one token)")
        out.append(enc)
    return out


def causal_logits(model: Any, tokens: Int[torch.Tensor, "b p"],
                  attention_mask: Int[torch.Tensor, "b p"]) -> Float[torch.Tensor, "b p v"]:
    """Next-token logits of a TransformerLens or HF causal LM on a padded batch.

    TransformerLens gets the attention mask (it derives positions of left-padded rows from
    it); HF gets the mask and explicit ``position_ids`` counted from each row's first real
    token.
    """
    if is_hooked(model):
        return model(tokens, attention_mask=attention_mask, return_type="logits")
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    return model(input_ids=tokens, attention_mask=attention_mask, position_ids=positions).logits


def response_logprobs(
    model: Any, batch: RewardBatch
) -> list[Float[torch.Tensor, " t"]]:
    """Float32 log-probs of each row's response tokens (``log p(y_t | x, y_<t)``).

    Token ``j`` (unpadded index) is predicted by the logits at ``j - 1``; only the response
    rows' positions are passed through ``log_softmax``, in float32.
    """
    device = model_device(model)
    tokens = batch.tokens.to(device)
    mask = batch.attention_mask.to(device)
    with torch.no_grad():
        logits = causal_logits(model, tokens, mask)
    offsets = batch.offsets().tolist()
    out = []
    for row, (off, length, start) in enumerate(
        zip(offsets, batch.lengths.tolist(), batch.response_starts, strict=True)
    ):
        idx = torch.arange(off + start, off + length, device=device)
        lp = logits[row, idx - 1].float().log_softmax(-1)
        out.append(lp.gather(-1, tokens[row, idx].unsqueeze(-1)).squeeze(-1))
    return out


def implicit_rewards(
    policy: Any, reference: Any, inputs: Sequence[RewardInput | EncodedInput], beta: float,
    tokenizer: Any = None, batch_size: int = 8, padding_side: str = "right",
) -> ImplicitRewardResult:
    """Implicit rewards ``beta * sum_t [log pi - log pi_ref]`` over each input's response.

    Args:
        policy, reference: causal LMs (``HookedTransformer`` or HF ``*ForCausalLM``) with the
            same vocabulary; each runs on its own device, results come back on the policy's.
        inputs: ``(prompt, response)`` pairs, conversations ending with an assistant turn, or
            ``EncodedInput`` (ids with ``response_start``). The response is every token from
            ``response_start`` on (template closing tokens included).
        beta: the DPO temperature the policy was tuned with.
        tokenizer: needed for text inputs when the policy has no ``.tokenizer`` (HF models).
        batch_size, padding_side: batching; results do not depend on either.
    """
    if beta <= 0:
        raise TLRewardError(f"beta must be positive, got {beta}")
    vocab, ref_vocab = vocab_size(policy), vocab_size(reference)
    if vocab != ref_vocab:
        raise TLRewardError(f"policy and reference vocabularies differ ({vocab} vs {ref_vocab}); "
                            "implicit rewards need the same tokenizer")
    tok = tokenizer
    if tok is None and any(not isinstance(x, EncodedInput) for x in inputs):
        tok = getattr(policy, "tokenizer", None)
        if tok is None:
            raise TLRewardError("implicit_rewards needs a tokenizer for text inputs; pass "
                                "tokenizer= (HF models carry none), or pass EncodedInput items "
                                "with response_start set")
    encoded = encode_responses(inputs, tok)
    if not encoded:
        raise TLRewardError("no inputs to score")
    pad = getattr(tok, "pad_token_id", None)
    if pad is None and not is_hooked(policy):
        pad = getattr(policy.config, "pad_token_id", None)
    pol: list[torch.Tensor] = []
    ref: list[torch.Tensor] = []
    for b in range(0, len(encoded), batch_size):
        batch = collate(encoded[b:b + batch_size], pad or 0, padding_side, d_vocab=vocab)
        pol += response_logprobs(policy, batch)
        dev = pol[-1].device
        ref += [x.to(dev) for x in response_logprobs(reference, batch)]
    rewards = torch.stack([beta * (p - r).sum() for p, r in zip(pol, ref, strict=True)])
    ids = [e.ids[e.response_start:] for e in encoded]  # type: ignore[misc]
    toks = [tok.convert_ids_to_tokens(x) for x in ids] if tok is not None else [[] for _ in ids]
    return ImplicitRewardResult(rewards, pol, ref, ids, toks, float(beta))
