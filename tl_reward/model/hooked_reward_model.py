"""``HookedRewardModel``: a TransformerLens ``HookedTransformer`` whose unembed is the reward head.

``unembed.W_U`` is ``[d_model, K]`` for K objectives (the final norm's gain folded in, never
centred), so hooks, ``run_with_cache``, ``ActivationCache`` and ``transformer_lens.patching``
work unchanged. ``model(tokens)`` returns per-position head outputs ``[batch, pos, K]``, as
TransformerLens returns logits; ``return_type="reward"`` pools them at the last real token
(``[batch, K]``) and ``return_type="score"`` gives the combined scalar ``[batch]``.

Example:
    >>> model = HookedRewardModel.from_pretrained("tl-reward/smollm2-135m-hh")
    >>> model.rewards([("Is the sky blue?", "Yes, on a clear day.")]).score
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from transformer_lens import HookedTransformer, HookedTransformerConfig

from tl_reward.errors import TLRewardError, UnknownObjectiveError, check_choice
from tl_reward.model.heads import ArmoRMHead, LinearRewardHead, RewardHead, objective_names_of
from tl_reward.model.inputs import as_items, is_single
from tl_reward.model.loading import load_reward_model
from tl_reward.model.pooling import check_rule, implied_mask
from tl_reward.model.protocol import RewardModelMixin
from tl_reward.model.readout import normalise, read_rewards, readout_attachment
from tl_reward.tl_backend.fused_attention import fused_layers, install_fused_attention, set_fused


class HookedRewardModel(RewardModelMixin, HookedTransformer):
    """A reward model inside TransformerLens. Build it with :meth:`from_pretrained`.

    Attributes:
        reward_head: names the K objectives and combines them into ``score``.
        pooling: default pooling rule (``"hf"``, ``"legacy"`` or ``"mask"``).
        pad_token_id: the id the pooling rules treat as padding (the HF config's).
    """

    def __init__(
        self,
        cfg: HookedTransformerConfig | dict[str, Any],
        tokenizer: Any = None,
        move_to_device: bool = True,
        default_padding_side: str | None = "right",
        reward_head: RewardHead | None = None,
        pooling: str = "hf",
        pad_token_id: int | None = None,
    ) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            super().__init__(cfg, tokenizer, move_to_device,
                             default_padding_side if tokenizer is not None else None)
        self.reward_head = reward_head or LinearRewardHead(
            objective_names_of(None, self.cfg.d_vocab_out, None))  # reward, or objective_<i>
        self.pooling = check_rule(pooling)
        if pad_token_id is None and tokenizer is not None:
            pad_token_id = tokenizer.pad_token_id
        self.pad_token_id = pad_token_id
        install_fused_attention(self)
        self.setup()

    @property
    def fused_attention(self) -> bool:
        """Whether attention runs PyTorch's fused kernel where no hook needs the scores or
        pattern (:mod:`~tl_reward.tl_backend.fused_attention`; on by default). ``False``
        materialises every pattern, as TransformerLens does."""
        return all(fused_layers(self))

    @fused_attention.setter
    def fused_attention(self, on: bool) -> None:
        set_fused(self, on)

    # -- loading -------------------------------------------------------------------------
    @classmethod
    def from_pretrained(  # type: ignore[override]
        cls,
        name_or_path: str | None = None,
        hf_model: Any = None,
        tokenizer: Any = None,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.float32,
        pooling: str | None = None,
        objective_names: Sequence[str] | None = None,
        n_ctx: int | None = None,
        trust_remote_code: bool = False,
        lm_head_rows: Sequence[int] | None = None,
        step_tag: str | None = None,
        head_weights: Sequence[float] | None = None,
        **hf_kwargs: Any,
    ) -> HookedRewardModel:
        """Load a reward model by hub name, local directory, built-in name or HF object.

        Args:
            name_or_path: a hub name, a local directory saved by ``save_pretrained``, or a
                built-in name: ``"tl-reward/smollm2-135m-hh"`` (the demo RM),
                ``"tl-reward/smollm2-135m-multi"``, ``"tl-reward/smollm2-135m-prm"`` (the demo
                PRM, its step tag and ``head_weights`` applied). May be ``None`` with
                ``hf_model``.
            hf_model: an in-memory HF reward model (no download, no network call).
            tokenizer: its tokenizer (loaded from ``name_or_path`` when omitted).
            device, dtype: where and in which precision the TransformerLens weights live.
            pooling: override the architecture's pooling rule.
            objective_names: names for the K objectives.
            n_ctx: override the context length (default: the HF config's).
            trust_remote_code: needed for custom modeling code (ArmoRM, INF-ORM, QRM, ...).
            lm_head_rows: load a ``*ForCausalLM`` checkpoint whose reward is these rows of its
                LM head at the last token (Llama-3.1-Nemotron-70B-Reward-HF: ``[0]``).
            step_tag: a process reward model's step tag: a reward is read at each step
                (:mod:`tl_reward.model.steps`; Qwen2.5-Math-PRM's ``<extra_0>`` is known).
            head_weights: combine the K head outputs into the score (``[-1, 1]``: a
                two-class PRM head, or ``lm_head_rows=[bad, good]``: good minus bad).
        """
        return load_reward_model(
            cls, name_or_path, hf_model, tokenizer, device=device, dtype=dtype, pooling=pooling,
            objective_names=objective_names, n_ctx=n_ctx, trust_remote_code=trust_remote_code,
            lm_head_rows=lm_head_rows, step_tag=step_tag, head_weights=head_weights,
            **hf_kwargs,
        )

    def set_tokenizer(self, tokenizer: Any, default_padding_side: str | None = None) -> None:
        """Attach ``tokenizer`` as given: never re-fetched by name, BOS as the tokenizer adds it."""
        self.tokenizer = tokenizer
        if default_padding_side is not None:
            tokenizer.padding_side = default_padding_side
        if getattr(tokenizer, "padding_side", None) is None:
            tokenizer.padding_side = "right"
        adds_bos = len(tokenizer.encode("")) > 0
        self.cfg.tokenizer_prepends_bos = adds_bos
        self.cfg.default_prepend_bos = adds_bos

    # -- TransformerLens habits on a reward model -------------------------------------------------
    def to_tokens(  # type: ignore[override]
        self, input: Any, prepend_bos: Any = None, padding_side: str | None = None,
        move_to_device: bool = True, truncate: bool = True,
    ) -> Int[torch.Tensor, "batch pos"]:
        """Token ids of text, pairs or conversations as :meth:`build` makes them (chat template
        as ids, one BOS, :attr:`suffix_ids`), left-padded unless ``padding_side`` says
        otherwise. ``prepend_bos`` and ``truncate`` are TransformerLens's: BOS follows the
        tokenizer and the template, and an over-long input is an error, not cut."""
        if prepend_bos is False:  # TransformerLens's fragment habit (test_prompt, answers)
            raise TLRewardError(
                "a reward model scores whole sequences as its tokenizer and chat template build "
                "them; tokenising a fragment without BOS is a language-model habit (e.g. "
                "utils.test_prompt, which reads next-token logits this model does not have). "
                "Use model.tokenizer.encode for fragments and model.rewards to score replies")
        if prepend_bos is not None or truncate is not True:
            warnings.warn("prepend_bos and truncate are ignored: a reward model scores the "
                          "sequence its tokenizer and chat template build", stacklevel=2)
        batch = self.build(input, padding_side=padding_side or "left")
        return batch.tokens if move_to_device else batch.tokens.cpu()

    def to_str_tokens(  # type: ignore[override]
        self, input: Any, prepend_bos: Any = None, padding_side: str | None = None,
    ) -> list[str] | list[list[str]]:
        """Each token of an input (text, pair, conversation or ids) as its decoded string."""
        if isinstance(input, torch.Tensor) and input.ndim == 2:
            input = input[0] if input.shape[0] == 1 else list(input)
        items = as_items(input)
        out = [[self.tokenizer.decode([t]) for t in self.encode(x).ids] for x in items]
        return out[0] if is_single(input) else out

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """A reward model has no language-model head, so it cannot generate: raises."""
        raise TLRewardError(
            "a reward model cannot generate text: its unembedding is the reward head "
            f"({self.cfg.d_vocab_out} objective(s)), not a vocabulary. Generate with the policy "
            "(a HookedTransformer language model) and score the replies with model.rewards")

    def loss_fn(self, *args: Any, **kwargs: Any) -> Any:
        """A reward model has no next-token loss: raises."""
        raise TLRewardError("a reward model has no language-modelling loss; read rewards with "
                            "model.rewards or model(..., return_type='reward')")

    def tokens_to_residual_directions(self, tokens: Any) -> Any:
        """The reward model's unembedding has objective columns, not token columns: raises,
        naming :meth:`reward_direction`."""
        raise TLRewardError(
            f"this model's unembedding has {self.cfg.d_vocab_out} column(s), one per objective "
            f"{self.objectives}, not one per token; for the direction an objective reads use "
            "model.reward_direction(objective)")

    # -- forward -----------------------------------------------------------------------------
    def forward(  # type: ignore[override]
        self,
        input: Any,
        return_type: str | None = "logits",
        *,
        attention_mask: torch.Tensor | None = None,
        pool_positions: torch.Tensor | None = None,
        pooling: str | None = None,
        tokens: torch.Tensor | None = None,
        start_at_layer: int | None = None,
        stop_at_layer: int | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run the model.

        ``return_type``: ``"logits"`` (per-position head outputs ``[batch, pos, K]``),
        ``"reward"`` (pooled ``[batch, K]``), ``"score"`` (combined ``[batch]``) or ``None``;
        pooled values are read from the final residual in float32 (float64 for a float64
        model) whatever the weights' dtype, as every analysis reads them (through the hooked
        ``ln_final`` output instead when a hook sits on the final norm or the head).
        ``stop_at_layer`` returns the residual stream, as in TransformerLens.

        The padding rule, in one place: text, pairs and conversations are built by
        :meth:`build` (chat template as ids) and left-padded, so ``logits[:, -1]`` is the pooled
        token under the default rule; a token batch without ``attention_mask`` whose rows start
        with pad tokens is taken as left-padded and masked so (refused where the pad id is also
        the BOS and a row starts with two of them: pass the mask); right padding needs no mask
        except under ``pooling="mask"``, which reads it. ``pooling`` overrides the model's rule.
        """
        if return_type in ("loss", "both"):
            raise TLRewardError(
                "a reward model has no language-modelling loss; use return_type 'logits', "
                "'reward' or 'score'"
            )
        check_choice(return_type, ("logits", "reward", "score", None), "return_type")
        if not isinstance(input, torch.Tensor):  # text, pairs, conversations: one builder
            batch = self.build(input, padding_side="left")
            input, attention_mask = batch.tokens, batch.attention_mask
            if pool_positions is None and pooling is None:
                pool_positions = batch.pooled
        if start_at_layer is None and input.ndim == 1:
            input = input[None]
        if tokens is None and start_at_layer is None:
            tokens = input
        if (attention_mask is None and tokens is not None and self.pad_token_id is not None
                and bool((tokens[:, 0] == self.pad_token_id).any())):
            attention_mask = implied_mask(tokens, self.pad_token_id, self.bos_pad)
        if tokens is not None and attention_mask is not None:
            attention_mask = attention_mask.to(tokens.device)
        if stop_at_layer is not None:
            return super().forward(input, attention_mask=attention_mask, tokens=tokens,
                                   start_at_layer=start_at_layer, stop_at_layer=stop_at_layer,
                                   **kwargs)
        resid = super().forward(input, attention_mask=attention_mask, tokens=tokens,
                                start_at_layer=start_at_layer, stop_at_layer=self.cfg.n_layers,
                                **kwargs)
        normed = self.ln_final(resid)
        if return_type is None:
            return None
        if return_type == "logits":
            return self.head_outputs(normed)
        if tokens is None:
            raise TLRewardError("pooled rewards need tokens=...: pass them with start_at_layer")
        if pool_positions is None:
            pool_positions = self.pool_positions(tokens, attention_mask, pooling)
        # the module outputs when anything is attached to the norm or head, else the same
        # values afresh in float32 (read_rewards decides; here the forward's own normed is reused)
        attached = readout_attachment(self) is not None
        rewards, score = read_rewards(self, resid, tokens, pool_positions,
                                      normed if attached else None)
        if return_type == "reward":
            return rewards
        if score is None:
            raise UnknownObjectiveError(
                f"this model has objectives {self.objectives} and no combined score; use "
                "return_type='reward'")
        return score

    def final_residual(self, tokens: torch.Tensor, attention_mask: torch.Tensor
                       ) -> Float[torch.Tensor, "batch pos d_model"]:
        """The last block's ``hook_resid_post`` of a padded batch (differentiable)."""
        return self(tokens, attention_mask=attention_mask, stop_at_layer=self.cfg.n_layers)

    @torch.no_grad()
    def pooled_outputs(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor, pooling: str | None = None,
        read_at: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``(rewards [b, K], score [b] or None, gating [b, K] or None)`` of one padded batch,
        read by :func:`~tl_reward.model.readout.read_rewards` (float32; float64 for a float64
        model): what every scoring path of this backend calls. ``read_at = (rows, positions)``
        reads row ``rows[i]`` at ``positions[i]`` instead of each row at its pooled token (a
        PRM's steps: one forward, every tag), giving one output per pair."""
        resid = self.final_residual(tokens, attention_mask)
        if read_at is None:
            pos = self.pool_positions(tokens, attention_mask, pooling)
        else:
            rows_at, pos = (t.to(resid.device) for t in read_at)
            resid, tokens = resid[rows_at], tokens[rows_at]
        rewards, score = read_rewards(self, resid, tokens, pos)
        gating = None
        if isinstance(self.reward_head, ArmoRMHead):
            rows = torch.arange(tokens.shape[0], device=tokens.device)
            gpos = self.reward_head.gating_positions(tokens)
            gating = self.reward_head.gate(normalise(self, resid[rows, gpos]))
        return rewards, score, gating

    def head_outputs(
        self, normed: Float[torch.Tensor, "... d_model"]
    ) -> Float[torch.Tensor, "... K"]:
        """The K objective values of ``ln_final`` outputs: ``unembed`` for a linear head, the
        head's own forward (hooks ``reward_head.hook_pre``/``hook_post``) for an MLP head."""
        if self.reward_head.nonlinear:
            return self.reward_head.outputs(normed)
        return self.unembed(normed)

    @property
    def folded_head(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(W_U [d_model, K], b_U [K])``: the processed weights already fold the final norm's
        gain into the head."""
        return self.W_U, self.b_U
