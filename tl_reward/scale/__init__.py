"""Long jobs past one process: vocabulary sweeps over many models x prompts x vocabulary shards,
run locally or on a Ray cluster with the same call (see :mod:`tl_reward.scale.sweeps`)."""

from tl_reward.scale.sweeps import LocalExecutor, RayExecutor, SweepJob, run_sweeps

__all__ = ["LocalExecutor", "RayExecutor", "SweepJob", "run_sweeps"]
