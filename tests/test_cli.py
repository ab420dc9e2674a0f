"""The ``tl-reward`` command line."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from tl_reward import HookedRewardModel
from tl_reward.cli import main
from tl_reward.testing import save_tiny_reward_model


def test_score_pairs_and_jsonl(tmp_path, capsys) -> None:
    path = save_tiny_reward_model(tmp_path / "rm", "llama")
    out = tmp_path / "scores.csv"
    rc = main(["score", "--model", str(path), "--device", "cpu", "--prompt", "Is the sky blue?",
               "--response", "Yes.", "--response", "No, it is green.", "--output", str(out)])
    assert rc == 0
    df = pd.read_csv(out)
    model = HookedRewardModel.from_pretrained(str(path), device="cpu")
    ref = model.rewards([("Is the sky blue?", "Yes."), ("Is the sky blue?", "No, it is green.")])
    torch.testing.assert_close(torch.tensor(df["score"].values, dtype=torch.float32), ref.score,
                               atol=1e-5, rtol=0)
    lines = [{"messages": [{"role": "user", "content": "hi"},
                           {"role": "assistant", "content": "Hello!"}], "id": "m"},
             {"prompt": "hi", "response": "Hello!", "id": "p"}, {"text": "plain"}]
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("\n".join(json.dumps(x) for x in lines))
    assert main(["score", "--model", str(path), "--device", "cpu", "--input", str(jsonl),
                 "--output", str(out)]) == 0
    df = pd.read_csv(out, dtype={"label": str}).set_index("label")
    assert list(df.index) == ["m", "p", "2"]
    assert df.loc["m", "score"] == pytest.approx(df.loc["p", "score"], abs=1e-6)
    assert "score" in capsys.readouterr().out


def test_score_errors_are_reported_not_raised(tmp_path, capsys) -> None:
    assert main(["score", "--model", str(tmp_path / "missing"), "--prompt", "a",
                 "--response", "b"]) == 1
    assert "no model directory" in capsys.readouterr().err
    assert main(["score", "--model", str(tmp_path), "--prompt", "a"]) == 1


@pytest.mark.slow
def test_demo_command(capsys) -> None:
    from tl_reward.model.demo import HEAD_FILE

    if not HEAD_FILE.exists():
        pytest.skip("demo head not trained yet")
    assert main(["demo", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "chosen > rejected on" in out and "smollm2" in out


def test_help_imports_no_heavy_package() -> None:
    """``tl-reward --help`` took 15 s: every subcommand imported torch, TransformerLens and the
    analyses. Building the parser now imports none of them (torch alone takes ~2 s)."""
    import subprocess
    import sys

    code = ("import sys; from tl_reward.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'transformer_lens', 'transformers', 'sae_lens', "
            "'pandas', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_model_subcommand_takes_threads_and_device() -> None:
    """Only ``sweep`` had ``--threads``; on a loaded machine 2 threads ran 13x slower than 1."""
    from tl_reward.cli import SUBCOMMANDS, build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name in SUBCOMMANDS:
        opts = {o for a in sub.choices[name]._actions for o in a.option_strings}
        assert {"--threads", "--device"} <= opts, name
    args = build_parser().parse_args(["score", "--threads", "1", "--input", "x.jsonl"])
    assert args.threads == 1
