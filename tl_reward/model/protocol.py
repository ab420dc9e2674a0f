"""What every reward-model backend shares: objectives, sequence building, pooling, scoring.

:class:`RewardModelMixin` holds the reward-model methods that read only the model's tokenizer,
config (``n_ctx``, ``d_vocab``, ``device``), ``reward_head``, ``pooling``, ``pad_token_id`` and
``suffix_ids``; :class:`~tl_reward.model.hooked_reward_model.HookedRewardModel` (TransformerLens's
``HookedTransformer``) and :class:`~tl_reward.model.bridge_reward_model.BridgeRewardModel`
(its ``TransformerBridge``) each add :meth:`pooled_outputs`, the one place a backend reads its
rewards from its own forward, and what the decompositions read off the weights:
``folded_head``, ``final_residual``, and (where the default is wrong) :meth:`norm_gain`,
:meth:`value_bias` and :attr:`post_norms`; besides these the analyses read hooks by their
HookedTransformer names and the writing weights ``W_O`` and ``W_out``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float, Int

from tl_reward.errors import TLRewardError
from tl_reward.model.heads import Objective, RewardHead
from tl_reward.model.inputs import (
    EncodedInput,
    RewardBatch,
    RewardInput,
    as_items,
    collate,
    encode,
    encode_inputs,
)
from tl_reward.model.judge import load_judge
from tl_reward.model.pooling import pool_positions
from tl_reward.model.steps import StepFormat, StepRow, StepSpec, check_step_end, select_steps


class RewardModelMixin:
    """The reward-model half of a backend (see the module docstring)."""

    reward_head: RewardHead
    pooling: str
    pad_token_id: int | None
    tokenizer: Any
    cfg: Any
    #: ids appended after every text or conversation input (InternLM2's reward token); token-id
    #: inputs are taken as given.
    suffix_ids: tuple[int, ...] = ()
    #: how inputs are built when not as plain outcome inputs: a process reward model's
    #: :class:`~tl_reward.model.steps.StepFormat`, a judge's verdict template (an object with
    #: ``encode(tokenizer, item, suffix_ids) -> EncodedInput``); ``None`` for an outcome RM.
    input_format: Any = None
    #: whether the forward can start at a layer from a cached residual and a key/value prefix
    #: (HookedTransformer's ``start_at_layer``); a bridge runs HF's forward whole.
    starts_at_layer: bool = True
    #: ``(W [d_model, K], b [K])``: the head with the final norm's gain (and bias) folded in,
    #: so that ``rewards = normalise(h) @ W + b`` (each backend provides it).
    folded_head: tuple[torch.Tensor, torch.Tensor]

    # -- loading -----------------------------------------------------------------------------
    #: Load a causal LM as a generative judge on this backend
    #: (:func:`~tl_reward.model.judge.load_judge`): ``Model.from_judge(name, verdict=...)``.
    from_judge = classmethod(load_judge)

    # -- objectives ------------------------------------------------------------------------
    @property
    def objectives(self) -> list[str]:
        """Names of the K objectives (columns of ``W_U``)."""
        return self.reward_head.objectives

    def objective_index(self, objective: int | str) -> int:
        """Column of ``W_U`` for an objective name or index."""
        return self.reward_head.objective_index(objective)

    # -- inputs ------------------------------------------------------------------------------
    def encode(self, item: RewardInput) -> EncodedInput:
        """Token ids of one input (string, conversation, (prompt, response) or ids): the chat
        template as ids with one BOS, then :attr:`suffix_ids`; token ids are taken as given.
        A PRM or judge builds through its :attr:`input_format`."""
        if self.input_format is not None:
            return self.input_format.encode(self.tokenizer, item, self.suffix_ids)
        return encode(self.tokenizer, item, self.suffix_ids)

    @property
    def step_format(self) -> StepFormat | None:
        """A process reward model's step format (where each step's reward is read), else
        ``None``."""
        fmt = self.input_format
        return fmt if isinstance(fmt, StepFormat) else None

    def use_steps(self, tag: str | None, head_weights: Sequence[float] | None = None,
                  **format_kwargs: Any) -> None:
        """Read a reward at each step's ``tag`` (a :class:`~tl_reward.model.steps.StepFormat`
        with ``format_kwargs``; ``None`` leaves the format as it is) and, with
        ``head_weights``, combine the head's K outputs into the score with them (``[-1, 1]``:
        the second output minus the first, as a two-class PRM or a good/bad token pair is read).
        A tag sets pooling to ``"mask"`` (each step's input ends at its tag). The loaders call
        this for ``step_tag=`` and ``head_weights=``."""
        if head_weights is not None:
            w = torch.tensor([float(x) for x in head_weights])
            if w.numel() != self.reward_head.n_objectives:
                raise TLRewardError(
                    f"head_weights has {w.numel()} entries for the head's "
                    f"{self.reward_head.n_objectives} outputs {self.objectives}; give one each")
            self.reward_head.weights = w.to(self.cfg.device)
        if tag is not None:
            self.input_format = StepFormat.from_tokenizer(self.tokenizer, tag, **format_kwargs)
            # a step's input ends at its tag: read the last real token whatever the pad id
            # (a rule that stops at the first pad would read inside a chat template's turns)
            self.pooling = "mask"

    def at_steps(self, inputs: Any, step: StepSpec, names: Sequence[str] | None = None
                 ) -> tuple[list[EncodedInput], list[StepRow]]:
        """The inputs of the selected steps (:func:`~tl_reward.model.steps.select_steps`):
        each the solution's ids up to that step's tag, an input every analysis takes, with
        the (input, step) each one is. What ``step=`` of every analysis runs."""
        if self.step_format is None:
            raise TLRewardError(
                "step= selects a process reward model's steps, and this model has no step "
                "format: load a PRM (from_pretrained(..., step_tag=...)), or drop step=")
        return select_steps(encode_inputs(self, as_items(inputs), names), step)

    def build(
        self, inputs: RewardInput | Sequence[RewardInput], padding_side: str = "right"
    ) -> RewardBatch:
        """The scored sequences of ``inputs``: ids (:meth:`encode`), mask, response starts and
        the pooled positions, padded on the model's device. Every analysis builds here."""
        return self.collate(encode_inputs(self, as_items(inputs)), padding_side)

    make_batch = build

    def encode_steps(self, inputs: Any, step: StepSpec | None = None,
                     names: Sequence[str] | None = None
                     ) -> tuple[list[EncodedInput], list[StepRow] | None]:
        """An analysis's inputs encoded: as given (``step=None``; a PRM's rows must then end
        at a tag), or the selected steps' prefixes and their (input, step) rows
        (:meth:`at_steps`). What ``step=`` of every analysis calls."""
        if step is None:
            return encode_inputs(self, as_items(inputs), names), None
        return self.at_steps(inputs, step, names)

    def collate(self, encoded: Sequence[EncodedInput], padding_side: str = "right",
                whole: bool = False) -> RewardBatch:
        """Pad already-encoded inputs (checking context length and vocabulary) and find each
        row's pooled position under the model's pooling rule. A PRM's rows must end at a step
        tag (:func:`~tl_reward.model.steps.check_step_end`) unless ``whole`` (whole solutions
        whose steps are read at their tags, as :meth:`rewards` reads them)."""
        if not whole:
            check_step_end(self, encoded)
        batch = collate(encoded, self.pad_token_id, padding_side, self.cfg.n_ctx, self.cfg.d_vocab)
        batch = batch.to(self.cfg.device)
        batch.pooled = self.pool_positions(batch.tokens, batch.attention_mask)
        return batch

    def response_template(self, prompt: Any) -> Any:
        """``prefix + [v] + suffix`` around a one-token reply to ``prompt``, as :meth:`encode`
        builds it (one BOS, :attr:`suffix_ids` closing the suffix; a judge's reply inside
        its verdict prompt); see :mod:`tl_reward.model.response_template`."""
        from tl_reward.model.response_template import response_template

        judged = getattr(self.input_format, "response_template", None)
        if judged is not None:  # a judge: the reply inside its verdict prompt
            return judged(self.tokenizer, prompt)
        return response_template(self.tokenizer, prompt, self.suffix_ids)

    @property
    def has_score(self) -> bool:
        """Whether the head combines its objectives into one score."""
        return self.reward_head.has_score

    def pool_positions(
        self,
        tokens: Int[torch.Tensor, "batch pos"],
        attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
        pooling: str | None = None,
    ) -> Int[torch.Tensor, " batch"]:
        """Position of the token each reward is read at (see :mod:`tl_reward.model.pooling`)."""
        return pool_positions(tokens, attention_mask, self.pad_token_id, pooling or self.pooling,
                              self.bos_pad)

    @property
    def bos_pad(self) -> bool:
        """Whether the pad id is also the BOS the tokenizer puts first, so that a leading pad
        cannot be told from the BOS without an attention mask."""
        tok = self.tokenizer
        return (tok is not None and self.pad_token_id is not None
                and bool(self.cfg.default_prepend_bos)
                and getattr(tok, "bos_token_id", None) == self.pad_token_id)

    def rewards(
        self,
        inputs: RewardInput | Sequence[RewardInput],
        batch_size: int = 8,
        padding_side: str = "right",
        pooling: str | None = None,
        progress: bool | None = None,
        labels: Sequence[str] | None = None,
        names: Sequence[str] | None = None,
        step: StepSpec | None = None,
    ) -> Any:
        """Score inputs in length-sorted batches; returns a :class:`RewardResult`. ``names``:
        what errors call each input (default ``input i``; the command line gives
        ``path:line``). A process reward model gives a
        :class:`~tl_reward.model.step_rewards.StepRewardResult`, one row per (input, step) of
        ``step`` (default every step), read in one forward per batch."""
        if self.step_format is not None:
            from tl_reward.model.step_rewards import score_steps

            return score_steps(self, inputs, "all" if step is None else step, batch_size,
                               padding_side, progress, labels, names)
        if step is not None:
            self.at_steps(inputs, step)  # the error naming what step= needs
        from tl_reward.model.scoring import score_inputs

        return score_inputs(self, inputs, batch_size=batch_size, padding_side=padding_side,
                            pooling=pooling, progress=progress, labels=labels, names=names)

    @property
    def post_norms(self) -> tuple[str, str] | None:
        """Names of the norm modules each block applies to its attention output and to its MLP
        output before adding them to the residual (``blocks[l].<name>``), or ``None`` where the
        outputs are added as they are. Gemma-2's sandwich norms: ``("ln1_post", "ln2_post")``;
        OLMo-2 on the bridge (norms after each sublayer, none before): ``("ln1", "ln2")``.
        The decompositions freeze their scale; edge circuits refuse such models."""
        return ("ln1_post", "ln2_post") if self.cfg.use_normalization_before_and_after else None

    def norm_gain(self, norm: Any) -> torch.Tensor | None:
        """The gain of one of the model's norm modules (``None``: folded away)."""
        return getattr(norm, "w", None)

    def value_bias(self, layer: int) -> torch.Tensor | None:
        """What block ``layer``'s values carry whatever the input (``[heads, d_head]``): 0
        once HookedTransformer's processing has folded it into ``b_O``."""
        return getattr(self.blocks[layer].attn, "b_V", None)  # type: ignore[attr-defined]

    # -- the readout ---------------------------------------------------------------------------
    def reward_direction(
        self,
        objective: Objective = "score",
        normed: Float[torch.Tensor, "batch pos d_model"] | None = None,
        tokens: Int[torch.Tensor, "batch pos"] | None = None,
        positions: Int[torch.Tensor, " batch"] | None = None,
    ) -> tuple[Float[torch.Tensor, "batch d_model"], Float[torch.Tensor, " batch"]]:
        """``(w, b)`` with ``objective = w . ln_final(h) + b`` at the pooled position, per row.

        For ArmoRM's ``"score"`` this is the prompt-dependent ``w_eff(x) = W_U T g(x)``, which
        needs ``normed`` (``ln_final`` output) and ``tokens``; for a fixed objective it does not.
        Returned in float32 (float64 for a float64 model) whatever the weights' dtype.
        For an MLP head it is the exact local linearisation at the pooled input,
        ``w_eff(x) = W1^T D(x) w2`` and ``b = w2 . D(x) b1 + b2`` (float32), which needs
        ``normed``, ``tokens`` and the pooled ``positions`` (``batch.pooled`` of :meth:`build`:
        the pooling rule applied with the attention mask, so padding never moves it).
        """
        acc = torch.float64 if self.cfg.dtype == torch.float64 else torch.float32
        w_u, b_u = self.folded_head
        device = w_u.device
        head = self.reward_head
        if head.nonlinear:
            if normed is None or tokens is None or positions is None:
                raise TLRewardError(
                    "this model's reward head is nonlinear (an MLP or a judge's rating), so its "
                    "direction depends on the input: pass normed= (ln_final output), tokens= "
                    "and positions= "
                    "(the pooled positions, e.g. batch.pooled from model.build)"
                )
            rows = torch.arange(tokens.shape[0], device=normed.device)
            w_all, b_all = head.linearise(normed[rows, positions.to(normed.device)])
            c = head.objective_weights(objective, normed, tokens).to(w_all.dtype)
            return torch.einsum("bk,bkd->bd", c, w_all), (c * b_all).sum(-1)
        if tokens is None:
            tokens = torch.zeros((1, 1), dtype=torch.long, device=device)
        if normed is None:
            normed = torch.zeros(*tokens.shape, self.cfg.d_model, device=device, dtype=acc)
        c = head.objective_weights(objective, normed, tokens).to(acc)
        return c @ w_u.to(acc).T, c @ b_u.to(acc)
