"""Process reward models: analyses across a solution's steps (a reward at every step).

Loading a PRM, its step format and per-step rewards live with the model
(:mod:`tl_reward.model.steps`, :mod:`tl_reward.model.step_rewards`); every analysis takes
``step=``. Here are the questions only steps ask: which earlier step a step's reward is read
from (:func:`step_sources`: the last attention hop, exactly; :func:`step_knockout`: every path,
by intervention), how a changed step moves the later steps' rewards (:func:`step_propagation`)
and whether two step graders agree (:func:`compare_steps`).
"""

from tl_reward._lazy import lazy_exports

_EXPORTS = {
    "StepSources": "tl_reward.process.sources",
    "step_sources": "tl_reward.process.sources",
    "StepComparison": "tl_reward.process.compare",
    "compare_steps": "tl_reward.process.compare",
    "StepKnockout": "tl_reward.process.knockout",
    "step_knockout": "tl_reward.process.knockout",
    "StepPropagation": "tl_reward.process.propagation",
    "step_propagation": "tl_reward.process.propagation",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
