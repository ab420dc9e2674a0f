"""``tl-reward faithfulness`` and ``tl-reward irm`` on tiny saved models: their numbers equal
the library's functions called in this process, and the HTML holds every section."""

from __future__ import annotations

import json

import pytest
import torch

from tl_reward import HookedRewardModel
from tl_reward.cli import main
from tl_reward.cli.common import read_pairs
from tl_reward.testing import save_tiny_reward_model
from tl_reward.testing.causal import tiny_causal_lm_pair

LINES = [{"prompt": "Is the sky blue?", "chosen": "Yes, on a clear day.", "rejected": "No."},
         {"prompt": "What is love?", "chosen": "Love. Friendship.", "rejected": "Hate. War."},
         {"prompt": "Be kind.", "chosen": "Thanks for asking.", "rejected": "Sure!"}]


@pytest.fixture
def pairs_file(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in LINES))
    return path


def test_faithfulness_command_equals_the_report_and_resumes(tmp_path, pairs_file, capsys):
    from tl_reward.analysis.faithfulness import faithfulness_report

    rm = save_tiny_reward_model(tmp_path / "rm", "llama", seed=0)
    out, cache = tmp_path / "f.html", tmp_path / "cache"
    args = ["faithfulness", "--model", str(rm), "--input", str(pairs_file), "--device", "cpu",
            "--cache-dir", str(cache), "--permutations", "200", "--output", str(out)]
    assert main(args) == 0
    first = capsys.readouterr().out
    text = out.read_text()
    assert "Mean Spearman rho per pairing" in text and "plotly" in text
    model = HookedRewardModel.from_pretrained(str(rm), device="cpu")
    want = faithfulness_report(model, read_pairs(pairs_file), progress=False).summary(200)
    for v in want.mean_rho:
        assert f"{v:.3f}" in first
    assert len(list(cache.iterdir())) >= 3  # one entry per pair at least
    assert main(args) == 0  # resumed from the cache: the same table
    assert capsys.readouterr().out.split("wrote")[0] == first.split("wrote")[0]


def test_irm_command_equals_implicit_rewards(tmp_path, pairs_file, capsys):
    from tl_reward.irm.implicit import implicit_rewards

    policy, reference, tok = tiny_causal_lm_pair("llama", seed=5)
    for name, m in (("policy", policy), ("reference", reference)):
        m.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    rm = save_tiny_reward_model(tmp_path / "rm", "llama", seed=0)
    out = tmp_path / "irm.html"
    assert main(["irm", "--policy", str(tmp_path / "policy"), "--reference",
                 str(tmp_path / "reference"), "--beta", "0.5", "--input", str(pairs_file),
                 "--prompt", "Love?", "--rm", str(rm), "--device", "cpu", "--top", "5",
                 "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    pairs = read_pairs(pairs_file)
    convs = [c for p in pairs for c in (p.chosen_conversation(), p.rejected_conversation())]
    r = implicit_rewards(policy, reference, convs, 0.5, tokenizer=tok).rewards.double()
    margins = r[0::2] - r[1::2]
    for m in margins.tolist():
        assert f"{m:.3f}" in printed
    acc = float((margins > 0).double().mean())
    assert f"chosen preferred on {acc:.3f} of 3 pairs" in printed
    text = out.read_text()
    for heading in ("Implicit rewards per pair", "token by token", "Tokens as the whole reply"):
        assert heading in text
    assert torch.isfinite(margins).all()


def test_irm_refuses_a_reward_model_as_reference(tmp_path, pairs_file, capsys):
    """A sequence-classification checkpoint as --reference is refused before loading (loaded
    as a causal LM it would get a random LM head: implicit rewards changing run to run)."""
    policy, _, tok = tiny_causal_lm_pair("llama", seed=5)
    policy.save_pretrained(tmp_path / "policy")
    tok.save_pretrained(tmp_path / "policy")
    rm = save_tiny_reward_model(tmp_path / "rm", "llama", seed=0)
    assert main(["irm", "--policy", str(tmp_path / "policy"), "--reference", str(rm),
                 "--beta", "0.5", "--input", str(pairs_file), "--device", "cpu",
                 "--output", str(tmp_path / "irm.html")]) == 1
    err = capsys.readouterr().err
    assert "LlamaForSequenceClassification, not a causal LM" in err and "--rm" in err
