"""Long jobs past one process, run locally or on a Ray cluster with the same call.

* :mod:`~tl_reward.scale.executors`: where units run (:class:`LocalExecutor`,
  :class:`RayExecutor`; a started pool is an executor too);
* :mod:`~tl_reward.scale.jobs`: the one chunked-job driver every long job runs through;
* :mod:`~tl_reward.scale.sweeps`: vocabulary sweeps over many models x prompts x shards.

Each other job is written once, in its analysis's module, and takes a loaded model (run in
this process) or a model spec (loaded by the workers); it is re-exported here: the faithfulness
report, the probe battery, layer Grams and maps, behavioural agreement.
"""

from tl_reward._lazy import lazy_exports

_EXPORTS = {
    "LocalExecutor": "tl_reward.scale.executors",
    "ModelSpec": "tl_reward.scale.executors",
    "RayExecutor": "tl_reward.scale.executors",
    "RayNotInstalledError": "tl_reward.scale.executors",
    "SweepJob": "tl_reward.scale.sweeps",
    "run_compare_layers": "tl_reward.compare.layers",
    "run_compare_models": "tl_reward.compare.behaviour",
    "run_faithfulness": "tl_reward.analysis.faithfulness",
    "run_layer_grams": "tl_reward.compare.layers",
    "run_probes": "tl_reward.audit.probes",
    "run_sweeps": "tl_reward.scale.sweeps",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
