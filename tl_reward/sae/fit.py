"""How well an SAE fits a reward model's own activations, and how much reward survives it.

:func:`sae_fit` runs the RM on its own (chat-templated) inputs, once clean and once with the
SAE spliced in without its error term (the reconstruction replaces the activation), and
reports, at every real (non-pad) position (``"all"``), at the real positions that hold no special
token (``"non_special"``: what :func:`~tl_reward.sae.training.collect_activations` trains on by
default; special tokens such as ``<|im_start|>`` carry outlier norms) and at the pooled token
(``"pooled"``, where the head reads) separately:

* ``explained_variance``: ``1 - sum|x - x_hat|^2 / sum|x - mean(x)|^2`` over the positions
  (the mean taken over the same positions, the sums centred and in float64: real RMs have
  massive-activation dimensions); 0 is the mean-only baseline.
* ``relative_mse``: ``sum|x - x_hat|^2 / sum|x|^2``: the error's share of the activation norm.
* ``l0``: mean number of active features per position; ``dead_fraction``: share of features
  never active there; ``dense_fraction``: share active at more than ``dense_threshold`` of
  the positions.

and the reward recovered, from the clean rewards ``r`` and spliced rewards ``r_sae`` (one
objective, read at the pooled token through the shared readout):

* ``reward_correlation``: Pearson correlation of ``r_sae`` with ``r`` (NaN, with the reason in
  ``verdict``, below 3 points: two points always correlate +/-1);
* ``reward_abs_diff_sd``: ``mean|r_sae - r| / sd(r)`` (sd with ddof 1);
* for preference pairs (margins ``m = r(chosen) - r(rejected)``): ``margin_correlation`` and
  ``flip_fraction``, the share of pairs whose preferred reply changes (``sign m_sae != sign m``).

The verdict (``fits``, and ``verdict`` saying why): the SAE fits when its explained variance at
the non-special positions is at least 0.7 and, spliced in, the rewards move by at most 0.5 of
their sd on average (:data:`FIT_THRESHOLDS`); a random SAE or one for another hook does not.

Example:
    >>> fit = sae_fit(model, sae, pairs)      # PreferencePairs, or any inputs model.build takes
    >>> fit.to_dataframe()
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float
from tqdm.auto import tqdm

from tl_reward.data.pairs import PairBatch, PreferencePair, TokenizedPair, as_pair_batch
from tl_reward.data.solutions import is_solution_pair
from tl_reward.model.inputs import encode_inputs
from tl_reward.model.steps import StepSpec
from tl_reward.results import ShortRepr
from tl_reward.sae.pretrained import prepare_sae
from tl_reward.sae.splice import as_sae_model, run_objectives

REGIONS = ("all", "non_special", "pooled")
FIT_THRESHOLDS = {"explained_variance": 0.7, "reward_abs_diff_sd": 0.5}
""":attr:`SAEFit.fits`: explained variance at the real non-special positions at least 0.7 and the
spliced rewards' mean absolute change at most 0.5 reward sd (see the module doc)."""
MIN_CORRELATION_POINTS = 3
"""Fewer points give no correlation (two points always give +/-1): NaN, with the reason."""


@dataclass(repr=False)
class SAEFit(ShortRepr):
    """:func:`sae_fit`'s result: reconstruction metrics per region (``"all"`` real positions,
    ``"non_special"`` ones, the ``"pooled"`` token), the reward recovered with the SAE spliced
    in (no error term), and the verdict: ``fits`` and why (``verdict``)."""

    hook_name: str
    objective: str
    reconstruction: dict[str, dict[str, float]]
    clean: Float[torch.Tensor, " n"]
    spliced: Float[torch.Tensor, " n"]
    n_pairs: int = 0
    recovered: dict[str, float] = field(default_factory=dict)
    fits: bool = False
    verdict: str = ""

    def headline(self) -> dict[str, Any]:
        """Explained variance per region, the reward recovered and the verdict."""
        ev = {r: round(m["explained_variance"], 3) for r, m in self.reconstruction.items()}
        return {"explained_variance": ev, **self.recovered, "verdict": self.verdict}

    def to_dataframe(self) -> pd.DataFrame:
        """One row per metric: reconstruction per region, reward recovered under ``"reward"``."""
        rows = [{"metric": k, "region": r, "value": v}
                for r, m in self.reconstruction.items() for k, v in m.items()]
        rows += [{"metric": k, "region": "reward", "value": v} for k, v in self.recovered.items()]
        return pd.DataFrame(rows)


def _items(model: Any, inputs: Any, step: StepSpec | None = None) -> tuple[list[Any], int]:
    """Inputs to score and the number of pairs (chosen replies first, then rejected)."""
    first = inputs[0] if isinstance(inputs, Sequence) and len(inputs) else inputs
    if step is not None:
        if not is_solution_pair(first):
            return list(model.at_steps(inputs, step)[0]), 0
        inputs = as_pair_batch(model, inputs, step)
    is_pair = isinstance(inputs, PairBatch) or isinstance(first, (PreferencePair, TokenizedPair)) \
        or (isinstance(first, tuple) and len(first) == 3 and isinstance(first[1], str))
    if not is_pair:
        return list(inputs), 0
    batch = as_pair_batch(model, inputs)
    return ([torch.tensor(p.chosen_ids) for p in batch]
            + [torch.tensor(p.rejected_ids) for p in batch], len(batch))


def _pearson(a: torch.Tensor, b: torch.Tensor, what: str, notes: list[str]) -> float:
    """Pearson correlation in float64; NaN (a note says why) below
    :data:`MIN_CORRELATION_POINTS` points or when either side is constant."""
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    if len(a) < MIN_CORRELATION_POINTS or not (a.norm() > 0 and b.norm() > 0):
        notes.append(f"{what} undefined: {len(a)} points (needs {MIN_CORRELATION_POINTS}, "
                     "not all equal)")
        return float("nan")
    return float((a * b).sum() / (a.norm() * b.norm()))


def _add(st: dict[str, Any], x: torch.Tensor, err: torch.Tensor, f: torch.Tensor) -> None:
    """Fold one batch's positions of a region into its running sums (float64; the centred sum
    of squares merged across batches by Chan et al.'s update, never ``sum x^2 - n mean^2``)."""
    nb, n = x.shape[0], st["n"]
    if not nb:
        return
    mb = x.mean(0)
    d = mb - st["mean"]
    st["m2"] += float((x - mb).pow(2).sum()) + float(d.pow(2).sum()) * n * nb / (n + nb)
    st["mean"] = st["mean"] + d * nb / (n + nb)
    st["n"] = n + nb
    st["sse"] += float(err.pow(2).sum())
    st["sq"] += float(x.pow(2).sum())
    st["l0"] += float((f != 0).sum())
    st["fired"] += (f != 0).sum(0).cpu().double()


def _verdict(ev: float, diff_sd: float, notes: list[str]) -> tuple[bool, str]:
    """Whether the SAE fits (:data:`FIT_THRESHOLDS`) and a sentence saying why."""
    ev_min, diff_max = FIT_THRESHOLDS["explained_variance"], FIT_THRESHOLDS["reward_abs_diff_sd"]
    bad = []
    if not ev >= ev_min:  # NaN fails too
        bad.append(f"explained variance {ev:.3g} < {ev_min} at the non-special positions")
    if not diff_sd <= diff_max:
        bad.append(f"spliced in, rewards move by {diff_sd:.3g} sd > {diff_max}")
    text = ("does not fit: " + "; ".join(bad) if bad else
            f"fits: explained variance {ev:.3g}, rewards move by {diff_sd:.3g} sd")
    return not bad, "; ".join([text, *notes])


def sae_fit(
    model: Any, sae: Any, inputs: Any, objective: str = "score", batch_size: int = 8,
    dense_threshold: float = 0.1, progress: bool | None = None, step: StepSpec | None = None,
) -> SAEFit:
    """Fit of ``sae`` on ``model``'s activations over ``inputs`` and the reward it recovers
    (definitions in :mod:`tl_reward.sae.fit`). ``inputs``: anything ``model.build`` takes, or
    preference pairs (then margins and flips are reported). The SAE is checked first
    (:func:`~tl_reward.sae.pretrained.prepare_sae`: an unfolded normalisation factor raises).
    ``step``: a process reward model's solutions at those steps (solution pairs ``(a, b)``:
    compared there)."""
    model = as_sae_model(model)
    hook = prepare_sae(model, sae).cfg.metadata.hook_name
    items, n_pairs = _items(model, inputs, step)
    stats = {r: {"sse": 0.0, "sq": 0.0, "mean": 0.0, "m2": 0.0, "n": 0, "l0": 0.0,
                 "fired": torch.zeros(sae.cfg.d_sae, dtype=torch.float64)} for r in REGIONS}
    clean, spliced = [], []
    encoded = encode_inputs(model, items)  # an error names the input, not its batch row
    starts = range(0, len(items), batch_size)
    for s in tqdm(starts, disable=not progress if progress is not None else None,
                  desc="sae_fit"):
        batch = model.collate(encoded[s : s + batch_size])
        tokens, mask = batch.tokens, batch.attention_mask
        seen: list[torch.Tensor] = []
        with torch.no_grad():
            with model.hooks(fwd_hooks=[(hook, lambda a, hook, seen=seen: seen.append(a))]):
                clean.append(run_objectives(model, tokens, mask, [objective])[:, 0].cpu())
            with model.saes(saes=[sae], use_error_term=False):
                spliced.append(run_objectives(model, tokens, mask, [objective])[:, 0].cpu())
            x = seen[0]
            f = sae.encode(x)
            x_hat = sae.decode(f).reshape(*x.shape[:2], -1).double()
            x = x.reshape(*x.shape[:2], -1).double()
        rows = torch.arange(x.shape[0], device=x.device)
        pooled = batch.pooled.to(x.device)
        real = mask.to(x.device).bool()
        special = torch.tensor(sorted(set(model.tokenizer.all_special_ids)), device=x.device)
        sel = {"all": real, "non_special": real & ~torch.isin(tokens.to(x.device), special),
               "pooled": torch.zeros_like(mask, dtype=torch.bool, device=x.device)}
        sel["pooled"][rows, pooled] = True
        for r, keep in sel.items():
            _add(stats[r], x[keep], (x - x_hat)[keep], f[keep])
    reconstruction: dict[str, dict[str, float]] = {}
    nan = float("nan")
    for r, st in stats.items():
        n = st["n"]
        reconstruction[r] = {
            "explained_variance": 1 - st["sse"] / st["m2"] if st["m2"] > 0 else nan,
            "relative_mse": st["sse"] / st["sq"] if st["sq"] > 0 else nan,
            "l0": st["l0"] / n if n else nan,
            "dead_fraction": float((st["fired"] == 0).double().mean()),
            "dense_fraction": float((st["fired"] / max(n, 1) > dense_threshold).double().mean()),
            "n_positions": float(n),
        }
    r_clean, r_sae = torch.cat(clean), torch.cat(spliced)
    notes: list[str] = []
    recovered = {
        "reward_correlation": _pearson(r_clean, r_sae, "reward_correlation", notes),
        "reward_abs_diff_sd": float((r_sae - r_clean).double().abs().mean()
                                    / r_clean.double().std()),
    }
    if n_pairs:
        m, m_sae = r_clean[:n_pairs] - r_clean[n_pairs:], r_sae[:n_pairs] - r_sae[n_pairs:]
        recovered["margin_correlation"] = _pearson(m, m_sae, "margin_correlation", notes)
        recovered["flip_fraction"] = float((torch.sign(m) != torch.sign(m_sae)).float().mean())
    fits, verdict = _verdict(reconstruction["non_special"]["explained_variance"],
                             recovered["reward_abs_diff_sd"], notes)
    return SAEFit(hook, objective, reconstruction, r_clean, r_sae, n_pairs, recovered, fits,
                  verdict)
