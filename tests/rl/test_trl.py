"""The reward model as a TRL reward function: called as GRPOTrainer 1.x calls it, it returns
``model.rewards`` and records the step (and, decomposed, parts that sum to each reward)."""

from __future__ import annotations

import importlib.util
import inspect
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from helpers import needs_hooked_transformer
from rl_script import hf_token_logratios, record_scripted, scripted_step

from tl_reward.rl.record import RunRecord, RunRecordError, read_table, reward_input
from tl_reward.rl.trl import PolicyLogRatio, RewardModelFunction

pytestmark = needs_hooked_transformer
HAS_TRL = importlib.util.find_spec("trl") is not None
needs_trl = pytest.mark.skipif(not HAS_TRL, reason="trl is not installed (pip install "
                               "'tl-reward[train]'): the GRPOTrainer checks need it")


def _trl_kwargs(step: int) -> dict[str, Any]:
    """The keywords GRPOTrainer 1.x passes besides prompts and completions (a dataset column
    included)."""
    return {"completion_ids": [[1, 2]] * 16, "trainer_state": SimpleNamespace(global_step=step),
            "log_extra": lambda column, values: None, "log_metric": lambda name, value: None,
            "answer": ["x"] * 16}


def test_called_as_trl_calls_it_it_returns_model_rewards(tmp_path: Path, rm: Any) -> None:
    prompts, completions = scripted_step(3)
    fn = RewardModelFunction(rm, RunRecord(tmp_path, model=rm, settings={}))
    out = fn(prompts=prompts, completions=completions, **_trl_kwargs(7))
    ref = rm.rewards([reward_input(p, c) for p, c in zip(prompts, completions, strict=True)])
    assert isinstance(out, list) and all(isinstance(r, float) for r in out)
    assert out == ref.values("score").tolist()
    rec = RunRecord.open(tmp_path)
    assert rec.steps() == [7]  # TRL's global step
    assert rec.read(7)["reward"].tolist() == out
    assert fn.__name__ == "reward_model"  # TRL's name for its column and metric


@needs_trl
def test_the_signature_is_the_one_grpo_trainer_calls() -> None:
    from trl import GRPOTrainer

    src = inspect.getsource(GRPOTrainer._calculate_rewards)
    assert "prompts=prompts, completions=completions, completion_ids=completion_ids_list" in src
    assert 'reward_kwargs["trainer_state"] = self.state' in src


def test_decomposed_parts_sum_to_each_reward(tmp_path: Path, rm: Any) -> None:
    rec = record_scripted(tmp_path, rm, steps=3)
    for step in rec.steps():
        parts, names = rec.components(step)
        assert names[-1] == "head_bias" and "L2.H0" in names
        np.testing.assert_allclose(parts.sum(1), rec.read(step)["reward"], rtol=0, atol=1e-5)


def test_conversations_and_empty_completions(tmp_path: Path, rm: Any) -> None:
    prompts = [[{"role": "user", "content": "Is the sky blue?"}]] * 4
    completions = [[{"role": "assistant", "content": "Yes."}],
                   [{"role": "assistant", "content": ""}],
                   [{"role": "assistant", "content": "No sky."}],
                   [{"role": "assistant", "content": " \n "}]]  # the encoder refuses it too
    rec = RunRecord(tmp_path, model=rm, settings={})
    out = RewardModelFunction(rm, rec, decompose=True)(prompts, completions)
    assert out[1] is None and out[3] is None  # unscorable: TRL gives it advantage 0
    ref = rm.rewards([[*p, *c] for p, c in zip(prompts, completions, strict=True)
                      if c[0]["content"].strip()]).values("score").tolist()
    assert [out[0], out[2]] == ref
    parts, _ = rec.components(0)
    assert np.isnan(parts[1]).all() and np.isnan(parts[3]).all()
    assert math.isclose(parts[2].sum(), out[2], abs_tol=1e-5)
    text = RewardModelFunction(rm)(["Is the sky blue?"] * 2, ["Yes.", "\t"])
    assert text[1] is None and text[0] == rm.rewards([("Is the sky blue?", "Yes.")]).score[0]


def test_a_repeated_step_and_a_foreign_record_are_refused(tmp_path: Path, rm: Any,
                                                          base_rm: Any) -> None:
    rec = RunRecord(tmp_path, model=rm, settings={})
    fn = RewardModelFunction(rm, rec)
    prompts, completions = scripted_step(0)
    fn(prompts, completions, trainer_state=SimpleNamespace(global_step=2))
    with pytest.raises(RunRecordError, match=r"called at step 2.*drop_from\(2\)"):
        fn(prompts, completions, trainer_state=SimpleNamespace(global_step=2))
    with pytest.raises(RunRecordError, match="another reward model"):
        RewardModelFunction(base_rm, rec)
    with pytest.raises(RunRecordError, match="decompose=True writes to a record"):
        RewardModelFunction(rm, decompose=True)
    with pytest.raises(RunRecordError, match="16 completions and 3 prompts"):
        fn(prompts[:3], completions)
    assert RewardModelFunction(rm)(prompts[:2], completions[:2]) == \
        rm.rewards([reward_input(p, c) for p, c in zip(prompts[:2], completions[:2],
                                                       strict=True)]).values().tolist()


@needs_trl
def test_a_grpo_run_records_every_step_as_trl_logs_it(tmp_path: Path, rm: Any) -> None:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from tl_reward.testing.causal import tiny_causal_lm

    policy, tok = tiny_causal_lm("llama", seed=0)
    rec = RunRecord(tmp_path / "record", model=rm, settings={"test": "grpo"})
    fn = RewardModelFunction(rm, rec, decompose=True)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=6, max_steps=2,
                      learning_rate=1e-3, logging_steps=1, report_to="none", use_cpu=True,
                      seed=0, save_strategy="no", log_completions=True,
                      num_completions_to_print=0, disable_tqdm=True,
                      generation_kwargs={"min_new_tokens": 6})
    torch.manual_seed(0)
    trainer = GRPOTrainer(model=policy.train(), reward_funcs=[fn], args=args,
                          processing_class=tok,
                          train_dataset=Dataset.from_dict({"prompt": list(scripted_step(0)[0])}))
    trainer.train()
    assert rec.steps() == [0, 1]
    logged = read_table(tmp_path / "out")  # TRL logs a step's rows after its update: step + 1
    for step in rec.steps():
        mine = rec.read(step)
        theirs = logged[logged.step == step + 1]
        assert mine["completion"].tolist() == theirs["completion"].tolist()
        np.testing.assert_allclose(mine["reward"], theirs["reward"], rtol=0, atol=1e-6)
        ref = rm.rewards([reward_input(p, c) for p, c in rec.inputs(step)]).values()
        np.testing.assert_allclose(mine["reward"], ref.numpy(), rtol=0, atol=1e-6)


def test_the_logratio_is_hf_forward_without_accelerates_autocast() -> None:
    from tl_reward.testing.causal import tiny_causal_lm_pair

    policy, reference, tok = tiny_causal_lm_pair("llama", seed=0)
    prompts = ["Is the sky blue?", "Tell me a joke.", "Is the sky blue?"]
    completion_ids = [[40, 41, 42, 2], [], [7, 8]]
    plain = PolicyLogRatio(policy, reference, tok)(prompts, completion_ids)
    # accelerate wraps a trained model's forward in bf16 autocast and keeps the original
    original = policy.forward

    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return original(*args, **kwargs)

    policy._original_forward, policy.forward = original, autocast_forward
    policy.train()
    got = PolicyLogRatio(policy, reference, tok)(prompts, completion_ids)
    assert policy.forward is autocast_forward and policy.training  # both restored
    np.testing.assert_array_equal(got, plain)
    assert np.isnan(got[1])  # no tokens: no log-ratio
    for i in (0, 2):
        ref = float(hf_token_logratios(policy, reference, tok(text=prompts[i])["input_ids"],
                                       completion_ids[i]).sum())
        assert abs(got[i] - ref) < 1e-5 and abs(ref) > 1e-2
    with torch.no_grad():  # the wrapper does change the numbers: it was really bypassed
        x = torch.tensor([[1, 40, 41, 42]])
        assert (policy(input_ids=x).logits.float() - original(input_ids=x).logits).abs().max() > 0


@needs_trl
def test_prompt_ids_are_the_ones_grpo_trainer_makes() -> None:
    from trl import GRPOTrainer

    from tl_reward.testing.causal import tiny_causal_lm

    policy, tok = tiny_causal_lm("llama", seed=0)
    trainer = SimpleNamespace(processing_class=tok, _is_vlm=False, environment_factories=None,
                              tools=None, chat_template=None, chat_template_kwargs={})
    ratio = PolicyLogRatio(policy, tiny_causal_lm("llama", seed=1)[0], tok)
    for prompts in (list(scripted_step(0)[0][:5]),
                    [[{"role": "user", "content": "Is the sky blue?"}],
                     [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "Why?"}]]):
        assert ratio.prompt_ids(prompts) == GRPOTrainer._tokenize_prompts(trainer, prompts)[0]


def test_logratio_refusals(tmp_path: Path, rm: Any) -> None:
    from tl_reward.testing.causal import tiny_causal_lm_pair

    policy, reference, tok = tiny_causal_lm_pair("llama", seed=0)
    with pytest.raises(RunRecordError, match="the policy itself"):
        PolicyLogRatio(policy, policy, tok)
    ratio = PolicyLogRatio(policy, reference, tok)
    with pytest.raises(RunRecordError, match="logratio= writes to a record"):
        RewardModelFunction(rm, logratio=ratio)
    fn = RewardModelFunction(rm, RunRecord(tmp_path, model=rm, settings={}), logratio=ratio)
    with pytest.raises(RunRecordError, match="completion_ids"):
        fn(*scripted_step(0))
    with pytest.raises(RunRecordError, match="3 completions' ids and 2 prompts"):
        ratio(["a", "b"], [[1], [2], [3]])
