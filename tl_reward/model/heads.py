"""Reward heads beyond the linear unembedding: how K objectives become one score.

``HookedRewardModel.unembed`` holds the K per-objective reward directions (``W_U`` is
``[d_model, K]``, final-norm gain folded in). A ``RewardHead`` says how they combine:
``score(x) = rewards(x) @ c(x)``, where ``c`` is fixed for a linear head and prompt-dependent
for ArmoRM (``c(x) = T g(x)``), so the effective direction is ``w_eff(x) = W_U c(x)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import nn
from torch.nn import functional as F
from transformer_lens.hook_points import HookPoint

from tl_reward.errors import TLRewardError, UnknownObjectiveError

Objective = int | str | torch.Tensor
Normed = Float[torch.Tensor, "batch pos d_model"]
Tokens = Int[torch.Tensor, "batch pos"]

ARMORM_OBJECTIVES: tuple[str, ...] = (
    "helpsteer-helpfulness",
    "helpsteer-correctness",
    "helpsteer-coherence",
    "helpsteer-complexity",
    "helpsteer-verbosity",
    "ultrafeedback-overall_score",
    "ultrafeedback-instruction_following",
    "ultrafeedback-truthfulness",
    "ultrafeedback-honesty",
    "ultrafeedback-helpfulness",
    "beavertails-is_safe",
    "prometheus-score",
    "argilla-overall_quality",
    "argilla-judge_lm",
    "code-complexity",
    "code-style",
    "code-explanation",
    "code-instruction-following",
    "code-readability",
)


def objective_names_of(hf_config: Any, k: int, default: Sequence[str] | None) -> list[str]:
    """The K objectives' names: ``default`` when it has K, else the HF config's ``id2label``
    unless HF's placeholders, else ``reward`` (K = 1) or ``objective_<i>``."""
    if default is not None and len(default) == k:
        return list(default)
    labels = [str((getattr(hf_config, "id2label", None) or {}).get(i, "")) for i in range(k)]
    if all(labels) and not all(lab == f"LABEL_{i}" for i, lab in enumerate(labels)):
        return labels
    return ["reward"] if k == 1 else [f"objective_{i}" for i in range(k)]


def objective_slot(objectives: Sequence[str], objective: int | str,
                   owner: str = "this result") -> int:
    """Position of ``objective`` (a name, or an index counted as Python counts, negative from
    the end) among the ``objectives`` of ``owner`` (for the errors); a clear error when it is
    not there."""
    names = list(objectives)
    if isinstance(objective, bool) or not isinstance(objective, (int, str)):
        raise UnknownObjectiveError(
            f"objective {objective!r} is out of range: pass a name or an integer index; {owner} "
            f"has {names}")
    if isinstance(objective, int):
        if not -len(names) <= objective < len(names):
            raise UnknownObjectiveError(
                f"objective index {objective} is out of range for the {len(names)} objectives "
                f"{names}; pass an index in [{-len(names)}, {len(names) - 1}] or a name")
        return objective % len(names)
    if objective not in names:
        raise UnknownObjectiveError(f"objective {objective!r} is not in {owner}; it has {names}")
    return names.index(objective)


class RewardHead(nn.Module):
    """Names the K objectives and combines their rewards into the model's score."""

    #: ``True`` for a head that is not linear in the normed final residual (an MLP head): the
    #: model then reads objectives through :meth:`outputs` and :meth:`linearise`, not ``W_U``.
    nonlinear: bool = False
    #: ``True`` when :meth:`combination` reads the normed states (ArmoRM's gate); otherwise it
    #: depends on the batch size alone.
    reads_states: bool = False

    def __init__(self, objectives: Sequence[str]) -> None:
        super().__init__()
        self.objectives = list(objectives)

    def outputs(
        self, normed: Float[torch.Tensor, "... d_model"]
    ) -> Float[torch.Tensor, "... K"]:
        """The K objective values at every position (nonlinear heads only)."""
        raise NotImplementedError(f"{type(self).__name__} is linear: use the model's unembed")

    def linearise(
        self, pooled: Float[torch.Tensor, "batch d_model"]
    ) -> tuple[Float[torch.Tensor, "batch K d_model"], Float[torch.Tensor, "batch K"]]:
        """``(W(x), b(x))`` with ``outputs(x) = W(x) x + b(x)`` exactly at ``x`` (nonlinear
        heads only)."""
        raise NotImplementedError(f"{type(self).__name__} is linear: use W_U and b_U")

    @property
    def n_objectives(self) -> int:
        return len(self.objectives)

    def objective_index(self, objective: int | str) -> int:
        """Index of an objective given by name or position (:func:`objective_slot`)."""
        return objective_slot(self.objectives, objective, "this model")

    @property
    def has_score(self) -> bool:
        """Whether the head combines its objectives into one score (the one place this is
        decided: a head with fixed ``weights`` has one; a plain multi-column head has none)."""
        return getattr(self, "weights", None) is not None

    def combination(
        self, normed: Normed, tokens: Tokens
    ) -> Float[torch.Tensor, "batch K"] | None:
        """``c(x)`` with ``score = rewards @ c(x)`` (the fixed ``weights`` for every row);
        ``None`` when the head has no score."""
        w = getattr(self, "weights", None)
        return None if w is None else w.to(normed.device, normed.dtype).expand(tokens.shape[0], -1)

    def objective_weights(
        self,
        objective: Objective,
        normed: Float[torch.Tensor, "batch pos d_model"],
        tokens: Int[torch.Tensor, "batch pos"],
    ) -> Float[torch.Tensor, "batch K"]:
        """Weights over objectives that select ``objective`` ('score', a name, index or vector)."""
        batch = tokens.shape[0]
        if isinstance(objective, torch.Tensor):
            w = objective.to(normed.device, normed.dtype)
            if w.shape[-1] != self.n_objectives:
                raise UnknownObjectiveError(
                    f"objective weights have {w.shape[-1]} entries, the head has "
                    f"{self.n_objectives}"
                )
            return w.expand(batch, -1)
        if objective == "score":
            c = self.combination(normed, tokens)
            if c is None:
                raise UnknownObjectiveError(
                    f"this head has {self.n_objectives} objectives {self.objectives} and no "
                    "combined score; pass objective=<name or index> or a weight vector"
                )
            return c
        onehot = torch.zeros(batch, self.n_objectives, device=normed.device, dtype=normed.dtype)
        onehot[:, self.objective_index(objective)] = 1.0
        return onehot

    def score(
        self,
        rewards: Float[torch.Tensor, "batch K"],
        normed: Float[torch.Tensor, "batch pos d_model"],
        tokens: Int[torch.Tensor, "batch pos"],
    ) -> Float[torch.Tensor, " batch"]:
        """The scalar score of each sequence."""
        return (rewards * self.objective_weights("score", normed, tokens)).sum(-1)


class LinearRewardHead(RewardHead):
    """A plain ``score`` layer: K = 1 gives the score; K > 1 has a score only if weighted."""

    def __init__(self, objectives: Sequence[str], weights: torch.Tensor | None = None) -> None:
        super().__init__(objectives)
        if weights is None and len(self.objectives) == 1:
            weights = torch.ones(1)
        self.register_buffer("weights", weights, persistent=False)


class ArmoRMHead(RewardHead):
    """ArmoRM's mixture-of-experts combination.

    ``u = W_reg h`` at the last token gives K objective rewards; a gating MLP (ReLU hidden layers,
    softmax at a temperature, times a learned scale) reads the final hidden state at the start
    of the last assistant header and gives ``g(x)``; ``score = g(x) . (T^T u) = u . (T g(x))``.
    The first gating layer has the final norm's gain folded in, so it reads ``ln_final``'s
    output directly. ``hook_gating`` caches ``g(x)``.
    """

    reads_states = True

    @property
    def has_score(self) -> bool:
        return True

    def __init__(
        self,
        objectives: Sequence[str],
        layers: Sequence[nn.Linear],
        transform: torch.Tensor,
        temperature: float,
        logit_scale: torch.Tensor,
        token_pattern: Sequence[int],
    ) -> None:
        super().__init__(objectives)
        self.layers = nn.ModuleList(layers)
        self.register_buffer("transform", transform.detach().clone())
        self.register_buffer("logit_scale", logit_scale.detach().clone().reshape(1))
        self.temperature = float(temperature)
        self.token_pattern = [int(t) for t in token_pattern]
        self.hook_gating = HookPoint()  # [batch, K]

    def gating_positions(self, tokens: Tokens) -> Int[torch.Tensor, " batch"]:
        """The last occurrence of the assistant-header pattern in each row (its first token)."""
        pattern = torch.tensor(self.token_pattern, device=tokens.device)
        n = len(self.token_pattern)
        if tokens.shape[1] < n:
            raise TLRewardError("sequence shorter than ArmoRM's assistant-header pattern")
        windows = tokens.unfold(1, n, 1)
        found = (windows == pattern).all(-1)
        if not bool(found.any(-1).all()):
            bad = (~found.any(-1)).nonzero().flatten().tolist()
            raise TLRewardError(
                f"rows {bad} lack ArmoRM's gating pattern {self.token_pattern} (the assistant "
                "header); format inputs with the model's chat template ending in an assistant turn"
            )
        idx = torch.arange(found.shape[1], device=tokens.device)
        return (idx * found.long() + (found.long() - 1)).argmax(-1)

    def gate(self, x: Float[torch.Tensor, "batch d_model"]) -> Float[torch.Tensor, "batch K"]:
        """``g``: the gating MLP on the (gain-folded) normed hidden state; the layers run in
        their own dtype (a float32 readout of a bf16 model would be refused by the first
        ``Linear``) and the softmax in the wider of theirs and that of ``x``."""
        logits = self.gating_logits(x.to(self.layers[0].weight.dtype))
        logits = logits.to(torch.promote_types(x.dtype, logits.dtype))
        return self.hook_gating(F.softmax(logits / self.temperature, dim=-1)
                                * self.logit_scale[0].to(logits.dtype))

    def gating_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The gating layers before the softmax: ReLU between ArmoRM's ``Linear`` layers."""
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = F.relu(x)
        return x

    def combination(
        self, normed: Normed, tokens: Tokens
    ) -> Float[torch.Tensor, "batch K"]:
        pos = self.gating_positions(tokens)
        g = self.gate(normed[torch.arange(tokens.shape[0], device=tokens.device), pos])
        return (g @ self.transform.T.to(g.dtype)).to(normed.dtype)
