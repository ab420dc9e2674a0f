"""The policy's log-ratio recorded during a real GRPO run: HF's own forward of the policy at
that step and of the reference on TRL's own token ids, 0 at step 0, and the per-token terms
TRL's logged KL is made of; the Goodhart axis read from it; the implicit reward over training
equal to irm.implicit's, and its agreement equal to scipy's on the same numbers."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from helpers import needs_hooked_transformer
from rl_script import GOODHART_PROMPTS, gold_words, hf_token_logratios, record_scripted
from scipy import stats

from tl_reward import load_result
from tl_reward.errors import TLRewardError
from tl_reward.rl.gain import _units
from tl_reward.rl.goodhart import SEQUENCE_KL_LABEL, goodhart_curve, kl_from_log_history
from tl_reward.rl.implicit import ImplicitRewardOverTraining, implicit_reward_over_training
from tl_reward.rl.record import COMPLETION_IDS, LOGRATIO, RunRecord, RunRecordError
from tl_reward.rl.trl import (
    PolicyLogRatio,
    RewardModelFunction,
    checkpoint_logratios,
    trl_checkpoints,
)

pytestmark = [needs_hooked_transformer, pytest.mark.skipif(
    importlib.util.find_spec("trl") is None, reason="trl is not installed")]
BETA = 0.04


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, rm: Any) -> SimpleNamespace:
    """Three GRPO steps of 6 prompts x 4 completions (beta > 0, float32) recording the
    log-ratio; what the reward function was called with and the policy's weights at the start
    of each step are kept."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tl_reward.testing.causal import tiny_causal_lm

    folder = tmp_path_factory.mktemp("grpo-logratio")
    policy, tok = tiny_causal_lm("llama", seed=0)
    policy.save_pretrained(folder / "policy")  # TRL loads its reference policy from a path
    policy.config._name_or_path = str(folder / "policy")
    reference = copy.deepcopy(policy)
    record = RunRecord(folder / "record", model=rm, settings={"beta": BETA}, grader=gold_words)
    fn = RewardModelFunction(rm, record, logratio=PolicyLogRatio(policy, reference, tok))
    calls: list[dict[str, Any]] = []
    weights: dict[int, dict[str, torch.Tensor]] = {}

    def reward_model(**kwargs: Any) -> list[float | None]:
        calls.append({"prompts": kwargs["prompts"], "ids": kwargs["completion_ids"]})
        return fn(**kwargs)

    class Weights(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                          **kwargs: Any) -> None:
            weights[state.global_step] = {k: v.detach().clone()
                                          for k, v in model.state_dict().items()}

    args = GRPOConfig(output_dir=str(folder / "out"), per_device_train_batch_size=24,
                      num_generations=4, max_completion_length=6, max_steps=3, beta=BETA,
                      bf16=False, learning_rate=3e-3, logging_steps=1, report_to="none",
                      use_cpu=True, seed=0, save_strategy="no", disable_tqdm=True)
    torch.manual_seed(0)
    trainer = GRPOTrainer(model=policy.train(), reward_funcs=[reward_model], args=args,
                          processing_class=tok, callbacks=[Weights()],
                          train_dataset=Dataset.from_dict({"prompt": list(GOODHART_PROMPTS)}))
    trainer.train()

    def policy_at(step: int) -> Any:
        model = tiny_causal_lm("llama", seed=0)[0]
        model.load_state_dict(weights[step])
        return model.eval()

    return SimpleNamespace(record=record, calls=calls, policy_at=policy_at, tok=tok,
                           reference=reference, history=trainer.state.log_history)


def test_the_recorded_logratio_is_hf_forward_on_trls_own_ids(run: SimpleNamespace) -> None:
    """Per row, HF's forward of the step's policy and of the reference on TRL's prompt and
    completion ids (brute force, one sequence at a time); 0 at step 0, where the policy is the
    reference; and TRL's logged kl is the mean over the step's tokens of k3 = exp(d) - d - 1,
    d = -(the same per-token log-ratios)."""
    kl = kl_from_log_history(run.history)
    assert run.record.steps() == sorted(kl) == [0, 1, 2]
    for step in run.record.steps():
        got = run.record.read(step)["logratio"].to_numpy()
        policy, call = run.policy_at(step), run.calls[step]
        terms = [hf_token_logratios(policy, run.reference, run.tok(text=p)["input_ids"],
                                    list(ids)) for p, ids in zip(call["prompts"], call["ids"],
                                                                 strict=True)]
        np.testing.assert_allclose(got, [float(t.sum()) for t in terms], rtol=0, atol=2e-5)
        d = -torch.cat(terms).double()
        k3 = float((d.exp() - d - 1).mean())
        np.testing.assert_allclose(k3, kl[step], rtol=1e-4, atol=1e-8)
        if step == 0:
            assert np.abs(got).max() == 0.0
        else:
            assert np.abs(got).max() > 1e-2
    assert kl[2] > 0


def test_the_goodhart_axis_is_the_records_kl_with_an_interval(run: SimpleNamespace) -> None:
    curve = goodhart_curve(run.record)
    assert curve.x_label == SEQUENCE_KL_LABEL and curve.has_kl
    for i, step in enumerate(run.record.steps()):
        df = run.record.read(step)
        units = _units(df, df[["logratio"]].to_numpy(np.float64), "prompt")[:, 0]
        assert curve.x[i] == pytest.approx(units.mean(), abs=1e-12)
    assert curve.x[0] == 0.0
    assert curve.x_ci_low is not None and curve.x_ci_high is not None
    ok = ~np.isnan(curve.x_ci_low)
    assert (curve.x_ci_low[ok] <= curve.x[ok]).all() and (curve.x[ok] <= curve.x_ci_high[ok]).all()
    assert {"x_ci_low", "x_ci_high"} <= set(curve.to_dataframe().columns)
    assert curve.plot().data[0].error_x.array is not None
    assert "logratio column" in curve.method
    trl = goodhart_curve(run.record, kl=run.history)  # TRL's per-token kl when passed
    assert trl.x_ci_low is None and trl.x_label != SEQUENCE_KL_LABEL and trl.has_kl


def test_the_implicit_reward_is_irm_implicits_own(run: SimpleNamespace) -> None:
    from tl_reward.irm.implicit import implicit_rewards
    from tl_reward.model.inputs import EncodedInput

    imp = implicit_reward_over_training(run.record, window=2)
    assert imp.beta == BETA and "run's settings" in imp.method
    assert imp.windows == [[0, 1], [2]]
    step = 2
    call = run.calls[step]
    items = [EncodedInput([*run.tok(text=p)["input_ids"], *ids], len(run.tok(text=p)["input_ids"]))
             for p, ids in zip(call["prompts"], call["ids"], strict=True)]
    ref = implicit_rewards(run.policy_at(step), run.reference, items, beta=BETA)
    rows = imp.rows[imp.rows["step"] == step].sort_values("row")
    np.testing.assert_allclose(rows["implicit_reward"], ref.rewards.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(rows["reward"], run.record.read(step)["reward"], rtol=0, atol=0)
    assert imp.implicit[0] == 0.0
    assert imp.implicit[2] == pytest.approx(
        _units(rows, rows[["implicit_reward"]].to_numpy(np.float64), "prompt").mean())
    assert implicit_reward_over_training(run.record, beta=1.0).implicit[2] == \
        pytest.approx(imp.implicit[2] / BETA)


def test_log_ratios_from_checkpoints_equal_the_recorded_ones(run: SimpleNamespace,
                                                             tmp_path: Path) -> None:
    """The record keeps TRL's completion ids; each step's log-ratio computed afterwards from
    the policy that sampled it (a model, or a TRL checkpoint folder loaded from disk) equals
    the one recorded during training, and so does the implicit reward over training. The
    policy of another step gives other numbers (what the check would catch)."""
    for step in run.record.steps():
        kept = run.record.read(step)[COMPLETION_IDS]
        assert [list(ids) for ids in kept] == [list(ids) for ids in run.calls[step]["ids"]]
    run.policy_at(2).save_pretrained(tmp_path / "out" / "checkpoint-2")
    (tmp_path / "out" / "checkpoint-x").mkdir()
    saved = trl_checkpoints(tmp_path / "out")
    assert saved == {2: tmp_path / "out" / "checkpoint-2"}
    got = checkpoint_logratios(run.record, {0: run.policy_at(0), 1: run.policy_at(1), **saved},
                               run.reference, run.tok, progress=False)
    for step in run.record.steps():
        np.testing.assert_allclose(got[step], run.record.read(step)[LOGRATIO], rtol=0,
                                   atol=1e-5)
    assert np.abs(got[2]).max() > 1e-2
    wrong = checkpoint_logratios(run.record, {2: run.policy_at(1)}, run.reference, run.tok,
                                 progress=False)
    assert np.abs(wrong[2] - got[2]).max() > 1e-2
    recorded = implicit_reward_over_training(run.record, window=2)
    again = implicit_reward_over_training(run.record, window=2, logratio=got)
    np.testing.assert_allclose(again.implicit, recorded.implicit, rtol=0, atol=1e-6)
    assert again.agreement[0].spearman_rho.value == pytest.approx(
        recorded.agreement[0].spearman_rho.value, abs=1e-9)
    assert "from checkpoints" in again.method
    with pytest.raises(RunRecordError, match=r"checkpoints for steps \[7\]"):
        checkpoint_logratios(run.record, {7: run.policy_at(0)}, run.reference, run.tok)
    with pytest.raises(RunRecordError, match="holds 3 values for the 24 rows of step 1"):
        implicit_reward_over_training(run.record, logratio={1: [0.0, 0.0, 0.0]})


def test_a_record_without_ids_is_refused_not_encoded_again(rm: Any, tmp_path: Path) -> None:
    from tl_reward.testing.causal import tiny_causal_lm_pair

    policy, reference, tok = tiny_causal_lm_pair("llama", seed=0)
    plain = record_scripted(tmp_path / "plain", rm, steps=1)
    with pytest.raises(RunRecordError, match="holds no completion_ids column, and the"):
        checkpoint_logratios(plain, {0: policy}, reference, tok)


def test_the_agreement_is_scipys_on_the_same_numbers(run: SimpleNamespace) -> None:
    imp = implicit_reward_over_training(run.record, window=3)
    assert len(imp.agreement) == 1
    rows = imp.rows
    for col in ("implicit_reward", "reward"):  # centred within each step's prompt group
        np.testing.assert_allclose(rows.groupby("group")[f"{col}_centred"].mean(), 0, atol=1e-9)
        np.testing.assert_allclose(rows[f"{col}_centred"], rows[col] - rows.groupby(
            ["step", "prompt"])[col].transform("mean"), atol=1e-12)
    many = rows[rows.groupby("group")["group"].transform("size") > 1]
    x, y = many["implicit_reward_centred"], many["reward_centred"]
    agr = imp.agreement[0]
    assert agr.spearman_rho.value == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
    assert agr.kendall_tau_b.value == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-12)
    assert agr.spearman_rho.n == many["group"].nunique() >= 10
    assert agr.spearman_rho.ci_low < agr.spearman_rho.value < agr.spearman_rho.ci_high
    rho = f"{agr.spearman_rho.value:+.2f}"
    assert imp.sentence().startswith("at steps 0-2 the implicit reward agrees with the reward "
                                     f"model's within prompts: Spearman {rho}")


def test_table_plot_file_report_and_refusals(run: SimpleNamespace, rm: Any,
                                             tmp_path: Path) -> None:
    from tl_reward.rl.report import run_report

    imp = implicit_reward_over_training(run.record, window=2)
    df = imp.to_dataframe()
    assert df["step"].tolist() == [0, 1, 2] and df["window"].tolist() == [0, 0, 1]
    assert df.loc[2, "spearman_rho"] == imp.agreement[1].spearman_rho.value
    assert {"implicit_ci_low", "kendall_tau_b_ci_high", "groups"} <= set(df.columns)
    fig = imp.plot()
    assert [t.name for t in fig.data] == ["implicit reward", "Spearman rho"]
    back = load_result(imp.save(tmp_path / "imp.tlr"))
    assert isinstance(back, ImplicitRewardOverTraining) and back.windows == imp.windows
    assert back.agreement[0].spearman_rho == imp.agreement[0].spearman_rho
    report = run_report(run.record, model=rm)
    assert report.implicit is not None and report.curve is not None
    assert report.curve.x_label == SEQUENCE_KL_LABEL
    assert any("implicit reward agrees" in p for p in report.parts() if isinstance(p, str))
    with pytest.raises(RunRecordError, match="holds no logratio column; record the run with"):
        implicit_reward_over_training(record_scripted(tmp_path / "plain", rm, steps=2))
    with pytest.raises(TLRewardError, match="beta must be positive"):
        implicit_reward_over_training(run.record, beta=0.0)
    with pytest.raises(TLRewardError, match="window"):
        implicit_reward_over_training(run.record, window=0)
