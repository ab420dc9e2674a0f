"""Reward models with planted mechanisms: known ground truth for checking every analysis.

Each ``plant_*`` function takes an HF Llama-style sequence classifier (not modified) and
returns a :class:`PlantedModel`: the planted HF model, the unplanted base, the tokenizer and a
frozen truth dataclass written before any analysis runs.
"""

from tl_reward.planted.implicit import ImplicitTruth, plant_implicit_reward
from tl_reward.planted.indirect import IndirectTruth, plant_indirect
from tl_reward.planted.objectives import RELATIONS, ObjectivesTruth, plant_objectives
from tl_reward.planted.prefix import PrefixTruth, plant_shared_prefix
from tl_reward.planted.prm import PRMTruth, plant_prm
from tl_reward.planted.store import load_planted, save_planted
from tl_reward.planted.trigger import PlantedModel, TriggerTruth, plant_trigger_head

__all__ = ["RELATIONS", "ImplicitTruth", "IndirectTruth", "ObjectivesTruth", "PRMTruth",
           "PlantedModel", "PrefixTruth", "TriggerTruth", "load_planted", "plant_implicit_reward",
           "plant_indirect", "plant_objectives", "plant_prm", "plant_shared_prefix",
           "plant_trigger_head", "save_planted"]
