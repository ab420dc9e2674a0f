"""Ground truth for the Goodhart curve: GRPO against a reward model with a planted trigger, graded
by the same reward model without it.

The proxy is the tiny seeded Llama classifier with ``reward += c`` planted in head L2.H0 on the
token ``" sky"`` (:func:`~tl_reward.planted.plant_trigger_head`); the gold grader is the
planted model's base, the same backbone with that head silenced (``PlantedModel.base``), so
proxy = gold + c x trigger, and gold pays nothing for the trigger. The policy is the tiny
seeded ``LlamaForCausalLM`` of ``experiments/rl_planted.py``, trained by TRL's ``GRPOTrainer``
on CPU with a KL penalty (``beta``), so TRL logs the KL from the reference policy.

Runs (:data:`RUNS`): ``strong`` (c = 4, 60 steps: the trigger dominates the advantage),
``weak`` (c = 1, 100 steps: the trigger competes with what gold pays for), and ``control``
(the same policy trained against the gold model itself: proxy = gold, no exploit).

Reported per run: proxy, gold, KL and trigger share per step; the Goodhart curve
(:func:`~tl_reward.rl.goodhart.goodhart_curve`: the gold peak, the proxy and gold change after
it, the proxy's first rise, L2.H0's lead time); the gain split where L2.H0 first shows, at the
peak and at the end (:func:`~tl_reward.rl.gain.reward_gain`); the text drift
(:func:`~tl_reward.rl.text.text_drift`, the trigger's presence as an extra property). Writes
``experiments/results/rl_goodhart.json``; the records stay in ``--work``.

Usage: ``python experiments/rl_goodhart.py [--runs strong weak control] [--seed 0]`` (about
3 CPU-minutes).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from rl_planted import PROMPTS, TRIGGER, add_run_arguments, log  # rl_planted.py's run
from rl_planted import grpo_run as planted_run

OUT = Path(__file__).resolve().parent / "results" / "rl_goodhart.json"


def grpo_run(rm: Any, gold: Any, folder: Path, args: argparse.Namespace) -> tuple[Any, Any]:
    """rl_planted.py's GRPO run against ``rm``, graded by the ``gold`` model."""
    from tl_reward.rl.record import model_grader

    return planted_run(rm, folder, args, grader=model_grader(gold))


def summarise(record: Any, history: Any, head: str, tokenizer: Any) -> dict[str, Any]:
    """The run's curve, the gain at the gold peak and at the end, and the text drift."""
    from scipy import stats

    from tl_reward.rl.gain import reward_gain
    from tl_reward.rl.goodhart import goodhart_curve, kl_from_log_history
    from tl_reward.rl.text import text_drift

    gain = reward_gain(record)
    curve = goodhart_curve(record, kl=history, component=head, gain=gain)
    drift = text_drift(record, tokenizer=tokenizer,
                       extra={"trigger": lambda t: float(TRIGGER in t)})
    frames = [record.read(s) for s in record.steps()]
    j = gain.components.index(head)

    def at(step: int) -> dict[str, Any]:
        if step not in gain.steps:
            return {"step": step}
        i = gain.steps.index(step)
        return {"step": step, "sentence": gain.sentence(step),
                "reward_change": float(gain.reward_change[i]),
                "head_change": float(gain.change[i, j]),
                "head_ci": [float(gain.ci_low[i, j]), float(gain.ci_high[i, j])],
                "top": gain.top(3, step).to_dict("records")}

    table = drift.table()
    uncorrected_rise = next((s for s, lo in zip(gain.steps, gain.reward_ci_low, strict=True)
                             if lo > 0), -1)
    uncorrected_signal = next((s for s, lo in zip(gain.steps, gain.ci_low[:, j], strict=True)
                               if lo > 0), -1)

    def gold_units(step: int) -> Any:
        return record.scored(step).groupby("prompt")["gold"].mean().to_numpy()

    to_peak = stats.ttest_ind(gold_units(curve.peak_step), gold_units(curve.steps[0]),
                              equal_var=False)
    ci = to_peak.confidence_interval(0.95)
    return {
        "steps": record.steps(),
        "proxy": curve.proxy.tolist(), "gold": curve.gold.tolist(),
        "kl": [kl_from_log_history(history)[s] for s in record.steps()],
        "trigger_share": [float(f["completion"].str.contains(TRIGGER).mean()) for f in frames],
        "curve": {"sentence": curve.sentence(), "peak_step": curve.peak_step,
                  "peak_kl": float(curve.x[curve.steps.index(curve.peak_step)]),
                  "proxy_after_peak": curve.proxy_after_peak,
                  "proxy_after_peak_ci": curve.proxy_after_peak_ci,
                  "gold_after_peak": curve.gold_after_peak,
                  "gold_after_peak_ci": curve.gold_after_peak_ci,
                  "overoptimised": curve.overoptimised,
                  "gold_to_peak": float(gold_units(curve.peak_step).mean()
                                        - gold_units(curve.steps[0]).mean()),
                  "gold_to_peak_ci": [float(ci.low), float(ci.high)],
                  "proxy_rise_step": curve.proxy_rise_step, "signal_step": curve.signal_step,
                  "lead_time": curve.lead_time,
                  "proxy_rise_step_uncorrected": uncorrected_rise,
                  "signal_step_uncorrected": uncorrected_signal, "method": curve.method},
        "gain_at_signal": at(curve.signal_step), "gain_at_peak": at(curve.peak_step),
        "gain_at_last": at(gain.steps[-1]),
        "drift": {"sentence": drift.sentence(), "r2": drift.r2,
                  "table": table[["property", "change", "change_ci_low", "change_ci_high",
                                  "coef", "explained", "share"]].to_dict("records"),
                  "method": drift.method}}


#: The runs: name -> (the trigger's planted reward c, or None: the proxy is the gold model
#: itself; steps).
RUNS = {"strong": (4.0, 60), "weak": (1.0, 100), "control": (None, 60)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--beta", type=float, default=0.01, help="KL penalty (TRL logs the KL)")
    add_run_arguments(parser, OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)

    from tl_reward import HookedRewardModel
    from tl_reward.model.demo import cache_dir
    from tl_reward.planted import plant_trigger_head
    from tl_reward.planted.recovery import component_name
    from tl_reward.testing import tiny_hf_reward_model

    work = args.work or cache_dir() / "rl_goodhart"
    hf, tok = tiny_hf_reward_model("llama")
    results: dict[str, Any] = {
        "setup": {"proxy": "tiny llama (tl_reward.testing), trigger planted in a head of the "
                           "last block with reward c",
                  "gold": "the planted model's base (the same backbone, that head silenced): "
                          "proxy = gold + c x trigger",
                  "runs": {k: {"c": c, "steps": n} for k, (c, n) in RUNS.items()},
                  "control": "the same policy trained against the gold model (proxy = gold)",
                  "trigger": TRIGGER,
                  "policy": "tiny LlamaForCausalLM (random weights), same tokenizer",
                  "trainer": "trl GRPOTrainer on CPU, KL penalty beta",
                  **{k: v for k, v in vars(args).items() if k not in ("work", "out", "runs")},
                  "prompts": list(PROMPTS)}}
    planted = plant_trigger_head(hf, tok, TRIGGER)
    head = component_name(planted.truth.component)
    gold = HookedRewardModel.from_pretrained(hf_model=planted.base, tokenizer=tok, device="cpu")
    for name in args.runs:
        c, args.steps = RUNS[name]
        if c is None:
            proxy = gold
        else:
            pl = plant_trigger_head(hf, tok, TRIGGER, c=c)
            proxy = HookedRewardModel.from_pretrained(hf_model=pl.model, tokenizer=tok,
                                                      device="cpu")
            log(f"{name}: planted {TRIGGER!r} -> {head}, c = {pl.truth.c}; gold: the base")
        start = time.time()
        record, history = grpo_run(proxy, gold, work / name, args)
        results[name] = {"c": c, "seconds": round(time.time() - start, 1),
                         **summarise(record, history, head, tok)}
        r = results[name]
        log(f"{name}: {r['seconds']} s; proxy {r['proxy'][0]:.2f} -> {r['proxy'][-1]:.2f}, "
            f"gold {r['gold'][0]:.2f} -> {r['gold'][-1]:.2f}, trigger share "
            f"{r['trigger_share'][0]:.2f} -> {r['trigger_share'][-1]:.2f}; "
            f"{r['curve']['sentence']}; {r['drift']['sentence']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=float))
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
