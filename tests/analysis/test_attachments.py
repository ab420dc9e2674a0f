"""Every analysis that returns rewards reads what the hooked forward records (issue 28).

For each attachment a user makes (a torch hook on a submodule, TransformerLens hooks on the final
norm and on the head's output, an SAE spliced in without its error term), each analysis's rewards
must equal ``model(..., return_type="reward")`` under the same attachment, or the analysis must
refuse, naming it. Each attachment moves the rewards by far more than the tolerance (checked), so
an analysis that ignored it fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from tests.helpers import CONVERSATIONS, parity_atol
from tests.sae.test_sae_fit import random_sae
from tl_reward.analysis.attribution import direct_reward_attribution
from tl_reward.analysis.attribution_patching import attribution_patching
from tl_reward.analysis.direct_path import direct_path_patching
from tl_reward.analysis.lens import reward_lens
from tl_reward.circuits import RewardCircuit, RewardGraph, edge_attribution, evaluate_circuit
from tl_reward.data.preference import PreferencePair
from tl_reward.errors import TLRewardError
from tl_reward.model.hooked_sae_reward_model import HookedSAERewardModel
from tl_reward.model.scoring import score_pairs
from tl_reward.sweep.vocab_sweep import PAPER_PROMPTS, score_vocabulary

PAIR = PreferencePair.from_prompt("Is the sky blue?", "Yes, on a clear day.", "No.")
IDS = list(range(20, 36))


def _forward(model: Any, convs: list[Any]) -> torch.Tensor:
    return model(convs, return_type="reward")[:, 0]


def _sweep(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
    tpl = model.response_template(PAPER_PROMPTS["best"])
    ref = model(torch.tensor([tpl.ids(v) for v in IDS]), return_type="reward")[:, 0]
    got = score_vocabulary(model, PAPER_PROMPTS["best"], IDS, progress=False).values(0)
    return got, ref


ANALYSES: dict[str, Callable[[Any], tuple[torch.Tensor, torch.Tensor]]] = {
    "rewards": lambda m: (m.rewards(CONVERSATIONS).values(0), _forward(m, CONVERSATIONS)),
    "score_pairs": lambda m: (score_pairs(m, [PAIR]).margin,
                              _forward(m, [PAIR.chosen_conversation()])
                              - _forward(m, [PAIR.rejected_conversation()])),
    "sweep": _sweep,
    "direct_attribution": lambda m: (direct_reward_attribution(m, CONVERSATIONS).reward[:, 0],
                                     _forward(m, CONVERSATIONS)),
    "lens": lambda m: (reward_lens(m, CONVERSATIONS).reward[:, 0], _forward(m, CONVERSATIONS)),
    "direct_path": lambda m: (torch.tensor(direct_path_patching(m, PAIR).clean_chosen),
                              _forward(m, [PAIR.chosen_conversation()])[0]),
    "attribution_patching": lambda m: (torch.tensor(attribution_patching(m, PAIR).clean_chosen),
                                       _forward(m, [PAIR.chosen_conversation()])[0]),
    "edge_attribution": lambda m: (edge_attribution(m, CONVERSATIONS, ablation="zero",
                                                    method="eap").clean_metric,
                                   _forward(m, CONVERSATIONS)),
    "evaluate_circuit": lambda m: (evaluate_circuit(m, _half_circuit(m), CONVERSATIONS,
                                                    ablation="zero").full,
                                   _forward(m, CONVERSATIONS)),
}


def _half_circuit(model: Any) -> RewardCircuit:
    graph = RewardGraph.from_model(model)
    return RewardCircuit.from_mask(graph, graph.edge_mask() & (torch.rand(graph.edge_mask().shape,
                                   generator=torch.Generator().manual_seed(0)) < 0.5))




@contextmanager
def attached(model: Any, kind: str) -> Iterator[tuple[Any, str]]:
    """``(model to analyse, the name its refusal must give)`` with the attachment in place."""
    if kind == "torch hook on blocks.0.mlp":
        handle = model.blocks[0].mlp.register_forward_hook(lambda m, i, o: o * 0.5)
        try:
            yield model, "blocks.0.mlp"
        finally:
            handle.remove()
    elif kind == "sae on blocks.0.hook_resid_post":
        sae_model = HookedSAERewardModel.from_reward_model(model)
        sae_model.add_sae(random_sae(model.cfg.d_model, "blocks.0.hook_resid_post", k=4),
                          use_error_term=False)
        yield sae_model, "blocks.0.hook_resid_post"
    else:
        hook = "ln_final.hook_normalized" if "ln_final" in kind else "unembed.hook_out"

        def fn(act: torch.Tensor, hook: Any) -> torch.Tensor:
            return 2 * act if "ln_final" in kind else act + 0.5

        with model.hooks(fwd_hooks=[(hook, fn)]):
            yield model, hook


KINDS = ["torch hook on blocks.0.mlp", "hook on ln_final.hook_normalized",
         "hook on unembed.hook_out", "sae on blocks.0.hook_resid_post"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_analysis_reads_the_hooked_forward(tiny: Any, kind: str) -> None:
    model = tiny("llama")[0]
    plain = _forward(model, CONVERSATIONS)
    outcomes = {}
    with attached(model, kind) as (m, name):
        hooked = _forward(m, CONVERSATIONS)
        for label, analysis in ANALYSES.items():
            try:
                got, ref = analysis(m)
            except TLRewardError as err:
                assert name in str(err), (label, str(err))
                outcomes[label] = "refused"
                continue
            tol = parity_atol(ref, model.cfg.n_layers)
            torch.testing.assert_close(got.to(ref.dtype), ref, atol=tol, rtol=0, msg=label)
            outcomes[label] = "equal"
    assert (hooked - plain).abs().max() > 0.05  # the attachment matters
    # the decompositions refuse exactly when the readout itself is hooked
    readout_hooked = "ln_final" in kind or "unembed" in kind
    for label in ("direct_attribution", "lens", "direct_path"):
        assert outcomes[label] == ("refused" if readout_hooked else "equal"), (label, outcomes)
    for label in ("rewards", "score_pairs", "sweep", "attribution_patching"):
        assert outcomes[label] == "equal", (label, outcomes)
    # edge circuits make an SAE's error term a node: one attached without it is refused
    for label in ("edge_attribution", "evaluate_circuit"):
        assert outcomes[label] == ("refused" if kind.startswith("sae") else "equal"), label
