"""How well an SAE fits a reward model's own activations, and how much reward survives it.

:func:`sae_fit` runs the RM on its own (chat-templated) inputs, once clean and once with the
SAE spliced in without its error term (the reconstruction replaces the activation), and
reports, at every real (non-pad) position (``"all"``), at the real positions that hold no special
token (``"non_special"``: what :func:`~tl_reward.sae.training.collect_activations` trains on by
default; special tokens such as ``<|im_start|>`` carry outlier norms) and at the pooled token
(``"pooled"``, where the head reads) separately:

* ``explained_variance``: ``1 - sum|x - x_hat|^2 / sum|x - mean(x)|^2`` over the positions
  (the mean taken over the same positions); 0 is the mean-only baseline.
* ``relative_mse``: ``sum|x - x_hat|^2 / sum|x|^2``: the error's share of the activation norm.
* ``l0``: mean number of active features per position; ``dead_fraction``: share of features
  never active there; ``dense_fraction``: share active at more than ``dense_threshold`` of
  the positions.

and the reward recovered, from the clean rewards ``r`` and spliced rewards ``r_sae`` (one
objective, read at the pooled token through the shared readout):

* ``reward_correlation``: Pearson correlation of ``r_sae`` with ``r``;
* ``reward_abs_diff_sd``: ``mean|r_sae - r| / sd(r)`` (sd with ddof 1);
* for preference pairs (margins ``m = r(chosen) - r(rejected)``): ``margin_correlation`` and
  ``flip_fraction``, the share of pairs whose preferred reply changes (``sign m_sae != sign m``).

A well-fitting SAE has explained variance near 1 and recovers the rewards (correlation near 1,
small differences, few flips); a random SAE or one for another hook does not.

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
from tl_reward.sae.pretrained import prepare_sae
from tl_reward.sae.splice import as_sae_model, run_objectives

REGIONS = ("all", "non_special", "pooled")


@dataclass
class SAEFit:
    """:func:`sae_fit`'s result: reconstruction metrics per region (``"all"`` real positions,
    ``"non_special"`` ones, the ``"pooled"`` token) and the reward recovered with the SAE
    spliced in (no error term)."""

    hook_name: str
    objective: str
    reconstruction: dict[str, dict[str, float]]
    clean: Float[torch.Tensor, " n"]
    spliced: Float[torch.Tensor, " n"]
    n_pairs: int = 0
    recovered: dict[str, float] = field(default_factory=dict)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per metric: reconstruction per region, reward recovered under ``"reward"``."""
        rows = [{"metric": k, "region": r, "value": v}
                for r, m in self.reconstruction.items() for k, v in m.items()]
        rows += [{"metric": k, "region": "reward", "value": v} for k, v in self.recovered.items()]
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        ev = {r: round(m["explained_variance"], 3) for r, m in self.reconstruction.items()}
        rec = {k: round(v, 3) for k, v in self.recovered.items()}
        return (f"SAEFit({self.hook_name}, n={self.clean.shape[0]}, pairs={self.n_pairs}, "
                f"explained_variance={ev}, {rec})")


def _items(model: Any, inputs: Any) -> tuple[list[Any], int]:
    """Inputs to score and the number of pairs (chosen replies first, then rejected)."""
    first = inputs[0] if isinstance(inputs, Sequence) and len(inputs) else inputs
    is_pair = isinstance(inputs, PairBatch) or isinstance(first, (PreferencePair, TokenizedPair)) \
        or (isinstance(first, tuple) and len(first) == 3 and isinstance(first[1], str))
    if not is_pair:
        return list(inputs), 0
    batch = as_pair_batch(model, inputs)
    return ([torch.tensor(p.chosen_ids) for p in batch]
            + [torch.tensor(p.rejected_ids) for p in batch], len(batch))


def _pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / (a.norm() * b.norm()))


def sae_fit(
    model: Any, sae: Any, inputs: Any, objective: str = "score", batch_size: int = 8,
    dense_threshold: float = 0.1, progress: bool | None = None,
) -> SAEFit:
    """Fit of ``sae`` on ``model``'s activations over ``inputs`` and the reward it recovers
    (definitions in :mod:`tl_reward.sae.fit`). ``inputs``: anything ``model.build`` takes, or
    preference pairs (then margins and flips are reported). The SAE is checked first
    (:func:`~tl_reward.sae.pretrained.prepare_sae`: an unfolded normalisation factor raises)."""
    model = as_sae_model(model)
    hook = prepare_sae(model, sae).cfg.metadata.hook_name
    items, n_pairs = _items(model, inputs)
    acc = torch.float64 if model.cfg.dtype == torch.float64 else torch.float32
    stats = {r: {"sse": 0.0, "sq": 0.0, "sum": None, "n": 0, "l0": 0.0,
                 "fired": torch.zeros(sae.cfg.d_sae, dtype=acc)} for r in REGIONS}
    clean, spliced = [], []
    starts = range(0, len(items), batch_size)
    for s in tqdm(starts, disable=not progress if progress is not None else None,
                  desc="sae_fit"):
        batch = model.build(items[s : s + batch_size])
        tokens, mask = batch.tokens, batch.attention_mask
        seen: list[torch.Tensor] = []
        with torch.no_grad():
            with model.hooks(fwd_hooks=[(hook, lambda a, hook, seen=seen: seen.append(a))]):
                clean.append(run_objectives(model, tokens, mask, [objective])[:, 0].cpu())
            with model.saes(saes=[sae], use_error_term=False):
                spliced.append(run_objectives(model, tokens, mask, [objective])[:, 0].cpu())
            x = seen[0]
            f = sae.encode(x)
            x_hat = sae.decode(f).reshape(*x.shape[:2], -1).to(acc)
            x = x.reshape(*x.shape[:2], -1).to(acc)
        rows = torch.arange(x.shape[0], device=x.device)
        pooled = batch.pooled.to(x.device)
        real = mask.to(x.device).bool()
        special = torch.tensor(sorted(set(model.tokenizer.all_special_ids)), device=x.device)
        sel = {"all": real, "non_special": real & ~torch.isin(tokens.to(x.device), special),
               "pooled": torch.zeros_like(mask, dtype=torch.bool, device=x.device)}
        sel["pooled"][rows, pooled] = True
        for r, keep in sel.items():
            xr, er, fr = x[keep], (x - x_hat)[keep], f[keep].to(acc)
            st = stats[r]
            st["sse"] += float(er.pow(2).sum())
            st["sq"] += float(xr.pow(2).sum())
            st["sum"] = xr.sum(0) if st["sum"] is None else st["sum"] + xr.sum(0)
            st["n"] += xr.shape[0]
            st["l0"] += float((fr != 0).sum())
            st["fired"] += (fr != 0).sum(0).cpu().to(acc)
    reconstruction: dict[str, dict[str, float]] = {}
    for r, st in stats.items():
        n = st["n"]
        mean = st["sum"] / n
        sst = st["sq"] - n * float(mean.pow(2).sum())
        reconstruction[r] = {
            "explained_variance": 1 - st["sse"] / sst,
            "relative_mse": st["sse"] / st["sq"],
            "l0": st["l0"] / n,
            "dead_fraction": float((st["fired"] == 0).to(acc).mean()),
            "dense_fraction": float((st["fired"] / n > dense_threshold).to(acc).mean()),
            "n_positions": float(n),
        }
    r_clean, r_sae = torch.cat(clean), torch.cat(spliced)
    recovered = {
        "reward_correlation": _pearson(r_clean, r_sae),
        "reward_abs_diff_sd": float((r_sae - r_clean).abs().mean() / r_clean.std()),
    }
    if n_pairs:
        m, m_sae = r_clean[:n_pairs] - r_clean[n_pairs:], r_sae[:n_pairs] - r_sae[n_pairs:]
        recovered["margin_correlation"] = _pearson(m, m_sae)
        recovered["flip_fraction"] = float((torch.sign(m) != torch.sign(m_sae)).float().mean())
    return SAEFit(hook, objective, reconstruction, r_clean, r_sae, n_pairs, recovered)
