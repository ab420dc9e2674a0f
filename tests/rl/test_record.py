"""The run record: one home per run, append-only steps written atomically, resumable only with
the same reward model and settings; and the readers of run tables (JSONL, parquet, TRL's)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from helpers import needs_hooked_transformer

from tl_reward.errors import StoreMismatchError, TokenizerMismatchError
from tl_reward.rl.record import RunRecord, RunRecordError, RunRecordMismatchError, read_table

pytestmark = needs_hooked_transformer

P, C = ["q1", "q1", "q2"], ["a", "b", "c"]


def test_steps_append_read_and_resume(tmp_path: Path, rm: Any) -> None:
    rec = RunRecord(tmp_path, model=rm, settings={"lr": 0.1})
    rec.append(0, P, C, [1.0, 2.0, 3.0], gold=[0.0, 1.0, 0.5])
    rec.append(3, P, C, [1.5, 2.5, 3.5], extra={"advantage": [0.1, 0.2, 0.3]})
    assert rec.steps() == [0, 3]
    again = RunRecord(tmp_path, model=rm, settings={"lr": 0.1})  # resumed: the steps stay
    assert again.steps() == [0, 3]
    again.append(4, P, C, [0.0, 0.0, 0.0])
    df = RunRecord.open(tmp_path).read()
    assert df["step"].tolist() == [0, 0, 0, 3, 3, 3, 4, 4, 4]
    assert df["reward"].tolist()[:3] == [1.0, 2.0, 3.0]
    assert df.loc[df.step == 3, "advantage"].tolist() == [0.1, 0.2, 0.3]
    assert np.isnan(df.loc[df.step == 3, "gold"]).all()
    assert "RunRecord(" in repr(again) and "3, 0 to 4" in repr(again)


def test_reopening_with_another_model_or_settings_names_what_differs(
        tmp_path: Path, rm: Any, base_rm: Any) -> None:
    RunRecord(tmp_path, model=rm, settings={"lr": 0.1, "seed": 0}).append(0, P, C, [1, 2, 3])
    with pytest.raises(RunRecordMismatchError, match=r"settings\.lr") as e:
        RunRecord(tmp_path, model=rm, settings={"lr": 0.2, "seed": 0})
    assert isinstance(e.value, StoreMismatchError)
    with pytest.raises(RunRecordMismatchError, match="model_fingerprint"):
        RunRecord(tmp_path, model=base_rm, settings={"lr": 0.1, "seed": 0})
    with pytest.raises(RunRecordMismatchError, match=r"functions\.grader"):
        RunRecord(tmp_path, model=rm, settings={"lr": 0.1, "seed": 0}, grader=lambda p, c: [])
    fresh = RunRecord(tmp_path, model=base_rm, settings={}, overwrite=True)
    assert fresh.steps() == []


def test_an_interrupted_write_leaves_no_half_step(tmp_path: Path, rm: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    rec = RunRecord(tmp_path, model=rm, settings={})
    rec.append(0, P, C, [1, 2, 3])
    real = pd.DataFrame.to_parquet

    def crash(self: pd.DataFrame, path: Path, *args: Any, **kwargs: Any) -> None:
        Path(path).write_bytes(b"PAR1 half a file")  # the write is cut short
        raise KeyboardInterrupt

    monkeypatch.setattr(pd.DataFrame, "to_parquet", crash)
    with pytest.raises(KeyboardInterrupt):
        rec.append(1, P, C, [1, 2, 3])
    assert rec.steps() == [0]  # the half-written step is not one
    assert list(tmp_path.glob("*.tmp"))
    monkeypatch.setattr(pd.DataFrame, "to_parquet", real)
    again = RunRecord(tmp_path, model=rm, settings={})  # reopening clears the leftover
    assert not list(tmp_path.glob("*.tmp"))
    again.append(1, P, C, [4, 5, 6])
    assert again.read(1)["reward"].tolist() == [4, 5, 6]


def test_bad_steps_and_rows_are_refused_by_name(tmp_path: Path, rm: Any) -> None:
    rec = RunRecord(tmp_path, model=rm, settings={})
    rec.append(2, P, C, [1, 2, 3])
    with pytest.raises(RunRecordError, match="step 2 is already recorded.*drop_from"):
        rec.append(2, P, C, [1, 2, 3])
    with pytest.raises(RunRecordError, match="step 1 comes after step 2"):
        rec.append(1, P, C, [1, 2, 3])
    with pytest.raises(RunRecordError, match="3 completions but 0 prompts"):
        rec.append(3, [], C, [1, 2, 3])
    with pytest.raises(RunRecordError, match="3 completions but 1 prompts"):
        rec.append(3, ["q"], C, [1, 2, 3])
    with pytest.raises(RunRecordError, match="non-negative integer"):
        rec.append(-1, P, C)
    with pytest.raises(RunRecordError, match=r"not finite in rows 1 \(1 of 3\)"):
        rec.append(3, P, C, [1.0, math.nan, 3.0])
    with pytest.raises(RunRecordError, match="2 rewards"):
        rec.append(3, P, C, [1.0, 2.0])
    with pytest.raises(RunRecordError, match="clashes"):
        rec.append(3, P, C, extra={"reward": [1, 2, 3]})
    rec.append(3, P, ["a", "", "c"], [1.0, None, 3.0])  # an empty completion goes unscored
    assert np.isnan(rec.read(3)["reward"][1])
    assert rec.steps() == [2, 3]
    assert rec.drop_from(3) == [3] and rec.steps() == [2]


def test_a_grader_that_returns_nan_is_refused_naming_the_rows(tmp_path: Path, rm: Any) -> None:
    def grader(prompts: list[Any], completions: list[Any]) -> list[float]:
        return [len(c) if c != "b" else math.nan for c in completions]

    rec = RunRecord(tmp_path, model=rm, settings={}, grader=grader)
    rec.append(0, P, ["a", "cc", "dd"], [1, 2, 3])
    assert rec.read(0)["gold"].tolist() == [1, 2, 2]
    with pytest.raises(RunRecordError, match=r"grader returned NaN or inf for rows 1 \(1 of 3\)"):
        rec.append(1, P, C, [1, 2, 3])
    with pytest.raises(RunRecordError, match="rows 0, 2"):
        rec.append(1, P, C, [1, 2, 3], gold=[math.nan, 1.0, math.inf])
    assert rec.steps() == [0]


def test_a_reward_model_with_another_tokenizer_is_refused(tmp_path: Path, rm: Any,
                                                          base_rm: Any, planted: Any) -> None:
    from tl_reward import HookedRewardModel

    rec = RunRecord(tmp_path, model=rm, settings={})
    rec.check_model(rm)
    other = copy.deepcopy(rm.tokenizer)  # the same vocabulary, another chat template
    other.chat_template = rm.tokenizer.chat_template.replace("<|eot_id|>", "<|eot_id|>\n")
    retok = HookedRewardModel.from_pretrained(hf_model=planted.model, tokenizer=other,
                                              device="cpu")
    with pytest.raises(TokenizerMismatchError, match="tokenizer saved with it"):
        rec.check_model(retok)
    with pytest.raises(RunRecordMismatchError, match="another reward model"):
        rec.check_model(base_rm)
    external = RunRecord(tmp_path / "ext", settings={"source": "trl"})
    external.check_model(base_rm)  # a record naming no model checks none


def test_open_is_read_only_and_refuses_other_folders(tmp_path: Path, rm: Any) -> None:
    RunRecord(tmp_path, model=rm, settings={}).append(0, P, C, [1, 2, 3])
    ro = RunRecord.open(tmp_path)
    assert ro.steps() == [0] and ro.identity.model_name == rm.cfg.model_name
    with pytest.raises(RunRecordError, match="read-only"):
        ro.append(1, P, C, [1, 2, 3])
    with pytest.raises(RunRecordError, match="no run record"):
        RunRecord.open(tmp_path / "nothing")
    with pytest.raises(RunRecordError, match="step 5 is not in the run record"):
        ro.read(5)


def test_conversations_round_trip(tmp_path: Path) -> None:
    chat = [[{"role": "user", "content": "Hi"}], [{"role": "user", "content": "Yo"}]]
    reply = [[{"role": "assistant", "content": "Hello"}], [{"role": "assistant", "content": ""}]]
    rec = RunRecord(tmp_path, settings={})
    rec.append(0, chat, reply, [1.0, None])
    assert rec.inputs(0) == list(zip(chat, reply, strict=True))
    assert rec.read(0)["prompt_chat"].all()
    with pytest.raises(RunRecordError, match="a string or a conversation"):
        rec.append(1, [3, 4], ["a", "b"])


def test_readers_jsonl_parquet_and_trl_logs(tmp_path: Path) -> None:
    rows = [{"step": s, "prompt": f"q{i}", "completion": f"a{i}", "reward": float(s + i),
             "gold": 0.5} for s in (1, 0) for i in range(2)]
    (tmp_path / "run.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    df = read_table(tmp_path / "run.jsonl")
    assert df["step"].tolist() == [0, 0, 1, 1] and "gold" in df
    pd.DataFrame(rows).to_parquet(tmp_path / "run.parquet")
    assert read_table(tmp_path / "run.parquet").equals(df)
    # TRL's GRPOTrainer log: <output_dir>/completions/completions_00001.parquet, a column per
    # reward function (named after it) and the advantage
    logs = tmp_path / "out" / "completions"
    logs.mkdir(parents=True)
    for s in (1, 2):
        pd.DataFrame({"step": [s, s], "prompt": [[{"role": "user", "content": "Hi"}]] * 2,
                      "completion": [[{"role": "assistant", "content": "x"}]] * 2,
                      "reward_model": [0.5, 1.5], "advantage": [-1.0, 1.0]}).to_parquet(
            logs / f"completions_{s:05d}.parquet")
    trl = read_table(tmp_path / "out")
    assert trl["step"].tolist() == [1, 1, 2, 2] and trl["reward"].tolist() == [0.5, 1.5] * 2
    assert trl["prompt"][0] == [{"role": "user", "content": "Hi"}]
    rec = RunRecord(tmp_path / "rec", settings={"source": "trl"})
    assert rec.extend(trl) == [1, 2]
    assert rec.inputs(2)[0] == ([{"role": "user", "content": "Hi"}],
                                [{"role": "assistant", "content": "x"}])
    assert rec.read(1)["advantage"].tolist() == [-1.0, 1.0]
    (logs / "completions_00003.parquet").write_bytes(
        pd.DataFrame({"step": [3], "prompt": ["p"], "completion": ["c"], "f": [1.0],
                      "g": [2.0]}).to_parquet())
    with pytest.raises(RunRecordError, match="several reward columns"):
        read_table(logs)
    assert read_table(logs, reward="f")["reward"].tolist()[-1] == 1.0
    with pytest.raises(RunRecordError, match="lacks the columns"):
        pd.DataFrame({"step": [0]}).to_parquet(tmp_path / "bad.parquet")
        read_table(tmp_path / "bad.parquet")
    with pytest.raises(RunRecordError, match="no completions_"):
        read_table(tmp_path / "rec")


def test_a_model_grader_scores_as_the_model_and_names_its_model(tmp_path: Path, rm: Any,
                                                                base_rm: Any) -> None:
    """``model_grader``: each completion's gold is the grading model's own reward; reopening
    the record with another model's grader is refused (its fingerprint is in the digest)."""
    from tl_reward.rl.record import model_grader, reward_input

    prompts, completions = ["Is the sky blue?", "hi"], ["Yes.", "No, it is green."]
    rec = RunRecord(tmp_path / "r", model=rm, grader=model_grader(base_rm))
    rec.append(0, prompts, completions, [0.0, 0.0])
    want = base_rm.rewards([reward_input(p, c) for p, c in zip(prompts, completions,
                                                               strict=True)]).score
    np.testing.assert_allclose(rec.read(0)["gold"].to_numpy(), want.double().numpy(),
                               rtol=0, atol=1e-6)
    RunRecord(tmp_path / "r", model=rm, grader=model_grader(base_rm))  # the same: resumes
    with pytest.raises(RunRecordMismatchError, match="grader"):
        RunRecord(tmp_path / "r", model=rm, grader=model_grader(rm))
