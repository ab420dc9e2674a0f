"""``--step``, ``--step-tag`` and ``--head-weights`` on the command line."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from tl_reward import HookedRewardModel
from tl_reward.cli import main
from tl_reward.testing import tiny_hf_reward_model, tiny_tokenizer

TAG = "<extra_0>"
LINES = [{"prompt": "Is the sky blue?", "steps": ["Yes, it is blue.", "Rayleigh scattering."],
          "id": "a"},
         {"prompt": "Is the sky blue?", "response": "Yes, it is blue.\n\nMusic.\n\nLove.",
          "id": "b"}]


@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory):  # noqa: ANN001, ANN201
    tok = tiny_tokenizer()
    tok.add_tokens([TAG], special_tokens=True)
    hf, tok = tiny_hf_reward_model("llama", num_labels=2, tokenizer=tok)
    path = tmp_path_factory.mktemp("prm")
    hf.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def model_opts(path) -> list[str]:  # noqa: ANN001
    return ["--model", str(path), "--device", "cpu", "--step-tag", TAG, "--head-weights=-1,1"]


def test_score_steps(prm_dir, tmp_path, capsys) -> None:  # noqa: ANN001
    src = tmp_path / "sol.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in LINES))
    out = tmp_path / "steps.csv"
    assert main(["score", *model_opts(prm_dir), "--input", str(src), "--output", str(out)]) == 0
    df = pd.read_csv(out, dtype={"label": str})
    assert df[["label", "step"]].values.tolist() == [["a", 0], ["a", 1], ["b", 0], ["b", 1],
                                                    ["b", 2]]
    model = HookedRewardModel.from_pretrained(str(prm_dir), device="cpu", step_tag=TAG,
                                              head_weights=[-1, 1])
    ref = model.rewards([("Is the sky blue?", LINES[0]["steps"]),
                         ("Is the sky blue?", LINES[1]["response"])])
    torch.testing.assert_close(torch.tensor(df["score"].values, dtype=torch.float32), ref.score,
                               atol=1e-5, rtol=0)
    assert main(["score", *model_opts(prm_dir), "--input", str(src), "--step", "last",
                 "--output", str(out)]) == 0
    assert pd.read_csv(out)["step"].tolist() == [1, 2]
    # without --step-tag the model is an outcome RM and --step is refused by name
    assert main(["score", "--model", str(prm_dir), "--device", "cpu", "--input", str(src),
                 "--step", "0"]) == 1
    assert "--step-tag" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse names the value and what --step takes
        main(["score", *model_opts(prm_dir), "--input", str(src), "--step", "x"])
    assert "'all' or 'last'" in capsys.readouterr().err


def test_sweep_and_explain_at_a_step(prm_dir, tmp_path) -> None:  # noqa: ANN001
    src = tmp_path / "sol.jsonl"
    src.write_text(json.dumps(LINES[0]))
    out = tmp_path / "sweep.parquet"
    assert main(["sweep", *model_opts(prm_dir), "--prompts-file", str(src), "--step", "1",
                 "--position", "0", "--output", str(out), "--top", "0"]) == 0
    df = pd.read_parquet(out)
    model = HookedRewardModel.from_pretrained(str(prm_dir), device="cpu", step_tag=TAG,
                                              head_weights=[-1, 1])
    e = model.encode(("Is the sky blue?", LINES[0]["steps"]))
    at = e.read_at[0] + 1
    v = int(df["token_id"].iloc[5])
    direct = model.rewards([e.ids[:at] + [v] + e.ids[at:]], step=1).score
    assert float(df["score:solution_0"].iloc[5]) == pytest.approx(float(direct[0]), abs=2e-5)
    html = tmp_path / "explain.html"
    assert main(["explain", *model_opts(prm_dir), "--prompt", "Is the sky blue?", "--chosen",
                 "Yes.\n\nBlue.", "--rejected", "No.\n\nGreen.", "--step", "1",
                 "--output", str(html)]) == 0
    assert html.stat().st_size > 10_000
