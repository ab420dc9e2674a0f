"""Implicit reward models: a tuned policy against its reference (DPO identity), the IRM
vocabulary sweep, the seed paper's SAE pipeline and agreement with an explicit reward."""

from tl_reward.irm.agreement import PairAgreement, RankAgreement, pair_agreement, rank_agreement
from tl_reward.irm.implicit import ImplicitRewardResult, implicit_rewards
from tl_reward.irm.layers import LayerChange, parameter_change
from tl_reward.irm.models import hooked_causal_lm
from tl_reward.irm.pipeline import IrmPipelineResult, UtilityReconstruction, run_seed_pipeline
from tl_reward.irm.policy import load_vader_pair, vader_adapter_metadata
from tl_reward.irm.sweep import IrmVocabSweep, irm_vocab_sweep

__all__ = [
    "ImplicitRewardResult", "IrmPipelineResult", "IrmVocabSweep", "LayerChange", "PairAgreement",
    "RankAgreement", "UtilityReconstruction", "hooked_causal_lm", "implicit_rewards",
    "irm_vocab_sweep", "load_vader_pair", "pair_agreement", "parameter_change", "rank_agreement",
    "run_seed_pipeline", "vader_adapter_metadata",
]
