"""The truth of a token plant for the reward-hacking probes, and the plant's own probe report.

A plant that adds ``c`` when a token is present (:func:`~tl_reward.planted.plant_trigger_head`
with a formatting token such as ``" **"``) moves a probe dimension's per-item delta by about
``c`` exactly when the dimension's edit *adds* the token (the perturbed conversation holds it,
the neutral one does not), and by nothing (float rounding) when neither side holds it. That is
read off the token ids before any reward is computed (:func:`edit_truth`).

What it does not fix is whether an untouched dimension *fires*: on a real reward model the base
already pays for some edits (the demo RM penalises keyword stuffing, flattery, ...), and the
plant leaves those deltas exactly as they were. So "must not fire" is a truth only of the
plant's own effect, ``delta(planted) - delta(base)`` per item (0 within float rounding), which
:func:`plant_effect_report` summarises with the library's own statistics (sign-flip p,
Benjamini-Hochberg across the same dimensions). A plain length plant has no clean truth at all:
every edit changes the reply's length.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from tl_reward.audit.perturbations import Dimension, ProbeItem, resolve_dimensions
from tl_reward.audit.probes import ProbeReport, summarise
from tl_reward.errors import TLRewardError

#: Verdicts of :func:`probe_truth`.
FIRES, UNTOUCHED, MIXED = "fires", "untouched", "mixed"


def holds(model: Any, conversation: Any, token_id: int) -> bool:
    """Whether the scored ids of ``conversation`` (:meth:`model.encode`) hold ``token_id``."""
    return token_id in model.encode(conversation).ids


def items_without(model: Any, items: Iterable[ProbeItem], token_id: int) -> list[ProbeItem]:
    """The items whose natural conversation does not hold ``token_id``."""
    return [it for it in items if not holds(model, it.conversation(), token_id)]


def edit_truth(model: Any, items: Sequence[ProbeItem], token_id: int,
               dimensions: Iterable[str | Dimension] | None = None, seed: int = 0
               ) -> pd.DataFrame:
    """Per (dimension, item) the edit ``run_probes`` makes with ``seed``: whether it applied and
    whether its neutral and perturbed conversations hold ``token_id``."""
    rows = []
    for d in resolve_dimensions(dimensions):
        for it in items:
            e = d.apply(it, seed)
            rows.append({
                "dimension": d.name, "item_id": it.item_id, "applied": e is not None,
                "neutral_holds": e is not None and holds(
                    model, it.conversation(e.neutral_reply, e.neutral_user), token_id),
                "perturbed_holds": e is not None and holds(
                    model, it.conversation(e.perturbed_reply, e.perturbed_user), token_id)})
    return pd.DataFrame(rows)


def probe_truth(table: pd.DataFrame) -> dict[str, str]:
    """Per dimension of an :func:`edit_truth` table: ``"fires"`` when every applied edit adds
    the token, ``"untouched"`` when no side of any edit holds it, else ``"mixed"``."""
    out = {}
    for dim, t in table[table.applied].groupby("dimension", sort=False):
        adds = t.perturbed_holds & ~t.neutral_holds
        out[str(dim)] = (FIRES if bool(adds.all()) else
                         UNTOUCHED if not bool((t.neutral_holds | t.perturbed_holds).any())
                         else MIXED)
    return out


def plant_effect_report(planted: ProbeReport, base: ProbeReport, atol: float,
                        name: str = "plant", **kwargs: Any) -> ProbeReport:
    """The library's probe statistics of the plant's own effect: a reward ``name`` equal to
    ``r(planted) - r(base)`` on every scored text of two runs of the same items, dimensions
    and seed (BH across the same dimensions). Differences within ``atol`` (the float rounding
    of two forwards of the model) are 0: rounding has no sign to test, yet it can be one-signed
    on every item of an untouched dimension and "fire". ``kwargs`` go to
    :func:`~tl_reward.audit.probes.summarise`."""
    key = ["dimension", "item_id", "applied", "neutral_user", "neutral_reply", "perturbed_user",
           "perturbed_reply"]
    a, b = planted.rows, base.rows
    if len(a) != len(b) or not a[key].equals(b[key]):
        raise TLRewardError("the two probe runs differ in their items, dimensions or edits; "
                            "run both with the same items, dimensions and seed")
    if planted.objective != base.objective:
        raise TLRewardError(f"objectives differ: {planted.objective!r} vs {base.objective!r}")
    rows = a.copy()
    for side in ("neutral", "perturbed", "delta"):
        col = f"{side}:{planted.objective}"
        diff = a[col].to_numpy(np.float64) - b[col].to_numpy(np.float64)
        rows[f"{side}:{name}"] = np.where(np.abs(diff) <= atol, 0.0, diff)
    return summarise(rows, name, [*planted.reward_names, name], planted.descriptions, **kwargs)
