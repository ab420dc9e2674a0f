"""``tl-reward compare``: two tiny saved RMs, a JSONL corpus with pairs, one offline HTML."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from tl_reward import HookedRewardModel
from tl_reward.cli import main
from tl_reward.cli.compare import read_compare_input
from tl_reward.testing import save_tiny_reward_model
from tl_reward.testing.browser import embedded_libraries

WORDS = ["Is the sky blue?", "Yes, on a clear day.", "No.", "I cannot help with that.",
         "Love. Friendship. Music.", "Drink water and sleep well.", "Hate. War.", "Sure!",
         "Thanks for asking.", "Be kind.", "What is love?", "The quick brown fox."]


def test_compare_command_writes_one_offline_report(tmp_path, capsys):
    a = save_tiny_reward_model(tmp_path / "rm_a", "llama", seed=0)
    b = save_tiny_reward_model(tmp_path / "rm_b", "llama", seed=1)
    lines = [{"prompt": WORDS[i], "chosen": WORDS[(i + 3) % 12], "rejected": WORDS[(i + 5) % 12]}
             for i in range(8)]
    lines += [{"prompt": WORDS[i], "response": WORDS[(2 * i + 1) % 12]} for i in range(6)]
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text("\n".join(json.dumps(x) for x in lines))
    corpus, pairs = read_compare_input(jsonl)
    assert len(corpus) == 14 and len(pairs) == 8
    out = tmp_path / "compare.html"
    rc = main(["compare", "--model", str(a), "--model", str(b), "--input", str(jsonl),
               "--device", "cpu", "--layers", "--permutations", "9",
               "--output", str(out)])
    assert rc == 0 and "wrote" in capsys.readouterr().out
    text = out.read_text()
    assert [n for n, _ in embedded_libraries(text)] == ["Plotly"]  # inlined, once
    assert 'src="https://cdn.plot.ly' not in text
    assert "preference_agreement" in text and "Layer x layer" in text
    # the report's Kendall tau equals scipy's on the two models' own rewards
    ra = HookedRewardModel.from_pretrained(str(a), device="cpu").rewards(corpus).score.numpy()
    rb = HookedRewardModel.from_pretrained(str(b), device="cpu").rewards(corpus).score.numpy()
    tau = stats.kendalltau(ra, rb).statistic
    assert f"{tau:.4g}" in text
    assert np.isfinite(tau)


def test_compare_command_errors(tmp_path, capsys):
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text(json.dumps({"text": "hello"}))
    a = str(tmp_path / "missing")
    assert main(["compare", "--model", a, "--input", str(jsonl)]) == 1
    assert "at least two" in capsys.readouterr().err
    assert main(["compare", "--model", a, "--model", a, "--input", str(jsonl)]) == 1
    assert "at least 10" in capsys.readouterr().err
    jsonl.write_text(json.dumps({"nothing": 1}))
    with pytest.raises(Exception, match="need 'messages'"):
        read_compare_input(jsonl)


def test_compare_a_single_reward_rm_with_one_objective_of_another(tmp_path, capsys):
    """Comparing the two demo RMs failed: one objective name for every model, and the
    multi-objective RM has no score. Now one objective per model, checked against scipy."""
    a = save_tiny_reward_model(tmp_path / "rm_a", "llama", seed=0)
    b = save_tiny_reward_model(tmp_path / "rm_b", "llama", num_labels=2, seed=1)
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text("\n".join(json.dumps({"prompt": WORDS[i], "response": WORDS[(i + 4) % 12]})
                               for i in range(12)))
    corpus, _ = read_compare_input(jsonl)
    base = ["compare", "--model", str(a), "--model", str(b), "--input", str(jsonl), "--device",
            "cpu", "--output", str(tmp_path / "c.html")]
    assert main(base) == 1
    assert "no combined score" in capsys.readouterr().err
    assert main([*base, "--objective", "score", "--objective", "objective_1"]) == 0
    text = (tmp_path / "c.html").read_text()
    ra = HookedRewardModel.from_pretrained(str(a), device="cpu").rewards(corpus).score.numpy()
    rb = HookedRewardModel.from_pretrained(str(b), device="cpu").rewards(corpus).rewards[:, 1]
    assert f"{stats.kendalltau(ra, rb.numpy()).statistic:.4g}" in text
    assert main([*base, "--objective", "a", "--objective", "b", "--objective", "c"]) == 1
    assert "once per --model" in capsys.readouterr().err
    capsys.readouterr()
    out = tmp_path / "e.html"
    assert main(["explain", "--model", str(b), "--prompt", "Hi", "--chosen", "Hello.",
                 "--rejected", "No.", "--device", "cpu", "--output", str(out)]) == 1
    assert "--objective" in capsys.readouterr().err  # explain no longer guesses the objective
