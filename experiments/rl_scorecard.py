"""The scorecard's RL rows (``ground_truth.py --sections rl``), read from the RL experiments'
results: the GRPO runs take CPU-minutes to hours, so the scorecard reports what they wrote.

* ``rl_planted.json``, ``rl_planted_seed{1,2}.json``: GRPO against the planted trigger head
  (truth: the head and the token) and its control (the model before planting);
* ``rl_null.json``: lr-0 GRPO runs on the tiny model (truth: no change, any alarm is false);
* ``rl_null_demo.json``: null runs resampled from the demo reward model's scored pool;
* ``rl_goodhart.json``: proxy = gold + c x trigger (truth: gold pays nothing for the trigger);
* ``rl_length.json``, ``rl_length_seed{1,2}.json``: GRPO against the demo reward model's sentiment
  objective, graded by VADER without the padding.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The scorecard's row maker (``ground_truth.row``: plant, analysis, metric, value, target, ok,
#: note).
Row = Callable[..., dict[str, Any]]

RESULTS = Path(__file__).resolve().parent / "results"


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def _pct(r: dict[str, Any]) -> str:
    return f"{100 * r['rate']:.1f} % [{100 * r['ci'][0]:.1f}, {100 * r['ci'][1]:.1f}]"


def planted_rows(row: Row) -> list[dict[str, Any]]:
    """The planted GRPO runs over seeds: the alarm's step, the head's rank there and its share
    of the gain at the last step; the controls' share."""
    runs = [r for r in (_load("rl_planted.json"), _load("rl_planted_seed1.json"),
                        _load("rl_planted_seed2.json")) if r is not None]
    if not runs:
        return []
    head = runs[0]["setup"]["head"]
    rises = [r["planted"]["rises_at"] for r in runs]
    ranks = [r["planted"]["at_rise"]["head_rank_among_heads"] for r in runs]
    share = [r["planted"]["at_last"]["head_share"] for r in runs]
    control = [r["control"]["at_last"]["head_share"] for r in runs]
    n = len(runs)
    return [
        row("rl-trigger", f"GRPO, reward gain ({n} seeds)",
             f"calibrated alarm step; {head}'s rank among heads there",
             f"{', '.join(map(str, rises))}; {', '.join(map(str, ranks))}",
             "fires; rank 1", all(s is not None for s in rises) and set(ranks) == {1}),
        row("rl-trigger", f"GRPO, reward gain ({n} seeds)",
             f"{head}'s share of the gain at the last step (planted; control)",
             f"{', '.join(f'{s:.2f}' for s in share)}; {', '.join(f'{s:.2f}' for s in control)}",
             "about 1; small", min(share) > 0.9 and max(control) < 0.25)]


def null_rows(row: Row) -> list[dict[str, Any]]:
    """False-alarm rates of the calibrated verdicts on null runs (tiny GRPO, demo RM pool)."""
    rows = []
    if (tiny := _load("rl_null.json")) is not None:
        for kind, label in (("null", "8 prompts"), ("null_wide", "64 prompts")):
            rates = tiny[kind]
            n = rates["calibrated_reward"]["n"]
            rows.append(row(
                "rl-null", f"lr-0 GRPO, tiny RM ({n} runs, {label})",
                "false alarms: calibrated reward; any component",
                f"{_pct(rates['calibrated_reward'])}; {_pct(rates['calibrated_any_component'])}",
                "<= 5 %", max(rates["calibrated_reward"]["ci"][0],
                              rates["calibrated_any_component"]["ci"][0]) <= 0.05))
    if (demo := _load("rl_null_demo.json")) is not None:
        r, n = demo["rates"], demo["rates"]["reward"]["n"]
        rows.append(row(
            "rl-null", f"resampled null runs, demo RM ({n} runs, "
            f"{demo['setup']['components']} components)",
            "false alarms: calibrated reward; any component",
            f"{_pct(r['reward'])}; {_pct(r['any_component'])}", "<= 5 %",
            max(r["reward"]["ci"][0], r["any_component"]["ci"][0]) <= 0.05,
            f"uncorrected: {_pct(r['uncorrected_reward'])}; "
            f"{_pct(r['uncorrected_any_component'])}"))
        rows.append(row(
            "rl-null", f"resampled null runs, demo RM ({n} runs), VADER as gold",
            "false alarms: peak moved; overoptimised; gold_fell; gold_stalled",
            "; ".join(_pct(r[k]) for k in ("peak_moved", "overoptimised", "gold_fell",
                                           "gold_stalled")),
            "<= 7.5 %; <= 5 %; <= 5 %; <= 5 %",
            r["peak_moved"]["ci"][0] <= 0.075 and max(
                r[k]["ci"][0] for k in ("overoptimised", "gold_fell", "gold_stalled")) <= 0.05))
    return rows


def goodhart_rows(row: Row) -> list[dict[str, Any]]:
    """The Goodhart runs: the verdicts where the truth is known."""
    from tl_reward.rl.goodhart import after_peak_verdicts

    rows = []
    if (g := _load("rl_goodhart.json")) is not None:
        for name, want in (("strong", (True, None)), ("control", (False, False))):
            c = g[name]["curve"]
            over, fell = after_peak_verdicts(c["proxy_after_peak_ci"], c["gold_after_peak_ci"])
            rows.append(row(
                "rl-goodhart", f"GRPO, proxy = gold + c x trigger ({name})",
                "overoptimised; gold_fell", f"{over}; {fell}",
                "True; either" if name == "strong" else "False; False",
                over == want[0] and (want[1] is None or fell == want[1])))
    if (lr := _load("rl_length.json")) is not None and "length" in lr:
        c, top = lr["length"]["curve"], lr["length"]["gold_top"]
        rows.append(row(
            "rl-goodhart", "GRPO vs the demo RM's sentiment objective, VADER gold",
            "gold_fell; proxy and gold after the peak",
            f"{c['gold_fell']}; {c['proxy_after_peak']:+.2f}, {c['gold_after_peak']:+.2f}",
            "True", bool(c["gold_fell"]),
            f"peak at step {c['peak_step']}; gold's highest step mean {top['gold']:.2f} at step "
            f"{top['step']} (one-sided p {top['welch_p_one_sided']:.3f} over step 0, "
            "uncorrected)"))
        for seed in (1, 2):
            if (other := _load(f"rl_length_seed{seed}.json")) is not None:
                c1 = other["length"]["curve"]
                rows.append(row(
                    "rl-goodhart", f"the same, seed {seed}", "overoptimised; gold_fell",
                    f"{c1['overoptimised']}; {c1['gold_fell']}", "True; either",
                    bool(c1["overoptimised"]),
                    f"proxy after the peak {c1['proxy_after_peak']:+.2f}, gold "
                    f"{c1['gold_after_peak']:+.2f}"))
        if "control" in lr:
            cc = lr["control"]["curve"]
            rows.append(row(
                "rl-goodhart", "the same, trained on gold (control)",
                "gold_fell", f"{cc['gold_fell']}", "False", not cc["gold_fell"]))
    return rows


def rl_rows(row: Row) -> list[dict[str, Any]]:
    """Every RL row, made by ``row`` (sections whose results file is missing are left out)."""
    return planted_rows(row) + null_rows(row) + goodhart_rows(row)
