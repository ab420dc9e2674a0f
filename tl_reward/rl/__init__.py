"""Reinforcement-learning runs against a reward model: record what the policy wrote and what
the reward model paid, and see which of the reward model's parts the policy exploits.

One module per piece; import them directly: :mod:`tl_reward.rl.record` (the run record and
its readers), :mod:`tl_reward.rl.trl` (a reward model as a TRL reward function, recording as
it scores, and the policy's log-ratio to its reference), :mod:`tl_reward.rl.gain` (the reward
gain split over components),
:mod:`tl_reward.rl.text` (what the policy's text changed, and the gain each change explains),
:mod:`tl_reward.rl.goodhart` (proxy against gold: the gold peak and a component's lead time),
:mod:`tl_reward.rl.implicit` (the policy's implicit reward over training against the reward
model's), :mod:`tl_reward.rl.report` (one offline HTML page of a run).
"""
