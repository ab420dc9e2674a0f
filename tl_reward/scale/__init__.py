"""Long jobs past one process, run locally or on a Ray cluster with the same call.

* :mod:`~tl_reward.scale.executors`: where units run (:class:`LocalExecutor`,
  :class:`RayExecutor`; a started pool is an executor too);
* :mod:`~tl_reward.scale.sweeps`: vocabulary sweeps over many models x prompts x shards;
* :mod:`~tl_reward.scale.faithfulness`: the faithfulness report over many pairs;
* :mod:`~tl_reward.scale.probes`: the reward-hacking probe battery over many items;
* :mod:`~tl_reward.scale.compare`: layer Grams / layer x layer maps over many inputs and models;
* :mod:`~tl_reward.scale.behaviour`: behavioural agreement of many models (one per worker).
"""

from tl_reward.scale.behaviour import run_compare_models
from tl_reward.scale.compare import run_compare_layers, run_layer_grams
from tl_reward.scale.executors import LocalExecutor, ModelSpec, RayExecutor, RayNotInstalledError
from tl_reward.scale.faithfulness import run_faithfulness
from tl_reward.scale.probes import run_probes
from tl_reward.scale.sweeps import SweepJob, run_sweeps

__all__ = ["LocalExecutor", "ModelSpec", "RayExecutor", "RayNotInstalledError", "SweepJob",
           "run_compare_layers", "run_compare_models", "run_faithfulness", "run_layer_grams",
           "run_probes", "run_sweeps"]
