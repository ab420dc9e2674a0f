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
    for label, rec in zip(df.index, lines, strict=True):  # each row's texts: its line's own
        msgs = rec.get("messages") or [{"content": rec.get("prompt")},
                                       {"content": rec.get("response")}]
        want = {"text": rec.get("text"), "prompt": None if "text" in rec else msgs[0]["content"],
                "response": None if "text" in rec else msgs[1]["content"]}
        assert {k: None if pd.isna(v) else v for k, v in df.loc[label, list(want)].items()} \
            == want, label
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


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Saved tiny RMs (one objective; two and no score), input files good and bad, an SAE."""
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.standard_sae import StandardSAE, StandardSAEConfig

    tmp = tmp_path_factory.mktemp("cli_errors")
    out = {"rm": save_tiny_reward_model(tmp / "rm", "llama"),
           "rm2": save_tiny_reward_model(tmp / "rm2", "llama", num_labels=2),
           "missing": tmp / "missing.jsonl", "nosae": tmp / "no_sae", "sae": tmp / "sae"}
    StandardSAE(StandardSAEConfig(d_in=64, d_sae=8, metadata=SAEMetadata(
        hook_name="blocks.1.hook_resid_post"))).save_model(out["sae"])
    texts = {"pairs": [{"prompt": "hi", "chosen": "Hello!", "rejected": "Go."}],
             "items": [{"prompt": "hi", "reply": "Hello there!"},
                       {"prompt": "Is the sky blue?", "reply": "Yes, mostly."}]}
    for name, lines in texts.items():
        out[name] = tmp / f"{name}.jsonl"
        out[name].write_text("\n".join(map(json.dumps, lines)))
    out["bad"], out["list"] = tmp / "bad.jsonl", tmp / "list.jsonl"
    out["bad"].write_text('{"prompt": "hi"}\n{"prompt": "hi",\n')
    out["list"].write_text('["hi", "Hello!"]\n')
    return out


CLI_ERRORS = [  # (argv with {file} names, message fragment)
    (["score", "--model", "{rm}", "--input", "{missing}"], "cannot read {missing}"),
    (["explain", "--model", "{rm}", "--input", "{bad}"], "{bad}:2: not valid JSON"),
    (["faithfulness", "--model", "{rm}", "--input", "{list}"], "{list}:1: a JSON list, not an "
                                                               "object"),
    (["score", "--model", "{rm}", "--device", "cuda:99", "--prompt", "a", "--response", "b"],
     "--device cuda:99: this machine has"),
    (["sae-fit", "--model", "{rm}", "--sae", "{nosae}", "--input", "{pairs}"],
     "{nosae} is not a saved SAE folder"),
    (["sae-fit", "--model", "{rm2}", "--sae", "{sae}", "--input", "{pairs}"],
     "no combined score; choose one with --objective NAME"),
    (["sweep", "--model", "{rm}", "--prompt", "word " * 300, "--top", "0", "--output",
      "{missing}.parquet"], "more than the model's context of 256"),
    (["audit", "--model", "{rm}", "--items", "{items}"], "2 base item(s): an audit needs at "
                                                        "least 3"),
]


@pytest.mark.parametrize(("argv", "fragment"), CLI_ERRORS, ids=[c[0][0] + ":" + c[1][:24]
                                                                  for c in CLI_ERRORS])
def test_cli_errors_are_messages_not_tracebacks(files, capsys, argv, fragment) -> None:
    names = {k: str(v) for k, v in files.items()}
    argv = [a.format(**names) for a in argv]
    if "--device" not in argv:
        argv += ["--device", "cpu"]
    assert main(argv) == 1
    assert fragment.format(**names) in capsys.readouterr().err


def test_sae_fit_objective_and_a_tie(files, capsys) -> None:
    """``sae-fit --objective`` reads that objective; a margin of exactly 0 is a tie."""
    from tl_reward.cli.explain import build_report
    from tl_reward.data.preference import PreferencePair

    assert main(["sae-fit", "--model", str(files["rm2"]), "--device", "cpu", "--sae",
                 str(files["sae"]), "--input", str(files["pairs"]), "--objective",
                 "objective_1"]) == 0
    assert "objective: 'objective_1'" in capsys.readouterr().out
    model = HookedRewardModel.from_pretrained(str(files["rm"]), device="cpu")
    same = PreferencePair.from_prompt("Is the sky blue?", "Yes.", "Yes.")
    summary = build_report(model, same, top_k=3)[1]
    row = dict(zip(summary["quantity"], summary["value"], strict=True))
    assert row["margin"] == "+0.0000" and row["prefers"] == "tie"


def _jsonl(path, lines):  # noqa: ANN001, ANN202 - line 2 is blank: lines are counted in the file
    path.write_text(json.dumps(lines[0]) + "\n\n" + "\n".join(map(json.dumps, lines[1:])) + "\n")
    return path


@pytest.mark.parametrize("record", [
    {"prompt": "hi", "chosen": "Hello!", "rejected": " "},
    {"chosen": "\n\nHuman: hi\n\nAssistant: Hello!", "rejected": "\n\nHuman: hi\n\nAssistant:"},
], ids=["fields", "hh-dialogues"])
def test_an_empty_reply_names_the_line_and_a_fix_the_cli_user_has(files, tmp_path, capsys,
                                                                  record) -> None:
    """The error advised ``skip_invalid=True to the loader``, an option the CLI lacks."""
    path = _jsonl(tmp_path / "pairs.jsonl", [{"prompt": "a", "chosen": "b", "rejected": "c"},
                                             record])
    for cmd in (["faithfulness"], ["sae-fit", "--sae", str(files["sae"])]):
        assert main([*cmd, "--model", str(files["rm"]), "--device", "cpu", "--input",
                     str(path)]) == 1
        err = capsys.readouterr().err
        assert f"{path}:3: the rejected response is empty" in err
        assert "skip_invalid" not in err and "delete the line" in err


def test_a_too_long_reply_names_the_line_it_is_on(files, tmp_path, capsys) -> None:
    """``input 1 has 8334 tokens`` counted rows after pairs were split in two and sorted by
    length; the CLI names the file's line (and the side of a pair)."""
    long = "Yes. " * 300
    model = HookedRewardModel.from_pretrained(str(files["rm"]), device="cpu")
    n = len(model.encode(("hi", long)).ids)
    assert n > model.cfg.n_ctx
    items = _jsonl(tmp_path / "items.jsonl", [{"prompt": "a", "response": "b"},
                                              {"prompt": "hi", "response": long},
                                              {"prompt": "c", "response": "d"}])
    pairs = _jsonl(tmp_path / "pairs.jsonl", [{"prompt": "a", "chosen": "b", "rejected": "c"},
                                              {"prompt": "hi", "chosen": "ok", "rejected": long}])
    for argv, who in ((["score", "--input", str(items)], f"{items}:3"),
                      (["faithfulness", "--input", str(pairs)], f"{pairs}:3 (rejected reply)"),
                      (["sae-fit", "--sae", str(files["sae"]), "--input", str(pairs)],
                       f"{pairs}:3 (rejected reply)")):
        assert main([*argv, "--model", str(files["rm"]), "--device", "cpu"]) == 1
        err = capsys.readouterr().err
        assert f"{who} has {n} tokens, more than the model's context of {model.cfg.n_ctx}" in err
