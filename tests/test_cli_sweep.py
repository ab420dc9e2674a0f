"""``tl-reward sweep``: the command line writes, resumes after a SIGKILL, shards and merges."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tl_reward.cli import main
from tl_reward.sweep.store import parts_dir
from tl_reward.sweep.vocab_sweep import PAPER_PROMPTS, load_sweep, score_vocabulary
from tl_reward.testing.tiny import save_tiny_reward_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = save_tiny_reward_model(tmp_path_factory.mktemp("m") / "tiny", "llama")
    out = tmp_path_factory.mktemp("ref") / "ref.parquet"
    assert main(["sweep", "--model", str(path), "--device", "cpu", "--output", str(out),
                 "--batch-size", "30", "--top", "3"]) == 0
    return path, out


def test_sweep_writes_the_paper_prompts(saved, tiny, tmp_path, capsys) -> None:
    path, out = saved
    assert main(["sweep", "--model", str(path), "--device", "cpu", "--output",
                 str(tmp_path / "few.parquet"), "--id-range", "40:70", "--top", "3"]) == 0
    printed = capsys.readouterr().out
    assert "30 tokens x 3 prompts" in printed and "top 3" in printed and "bottom 3" in printed
    sweep = load_sweep(out)
    assert sweep.labels == ["greatest", "best", "worst"]
    model = tiny("llama")[0]  # the same seeded weights, in memory
    ref = score_vocabulary(model, PAPER_PROMPTS, batch_size=30, progress=False)
    torch.testing.assert_close(sweep.scores, ref.scores, atol=1e-5, rtol=0)


def test_killed_sweep_resumes_to_the_same_file(saved, tmp_path) -> None:
    path, ref = saved
    out = tmp_path / "run.parquet"
    script = textwrap.dedent(f"""
        import os, signal
        from tl_reward import HookedRewardModel
        from tl_reward.sweep.vocab_sweep import PAPER_PROMPTS, score_vocabulary
        model = HookedRewardModel.from_pretrained({str(path)!r}, device="cpu")
        def die(done, total):
            if done >= 90:
                os.kill(os.getpid(), signal.SIGKILL)
        score_vocabulary(model, PAPER_PROMPTS, batch_size=30, output={str(out)!r},
                         callback=die, progress=False)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          timeout=300, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert not out.exists() and len(list(parts_dir(out).glob("chunk-*.parquet"))) == 3
    assert main(["sweep", "--model", str(path), "--device", "cpu", "--output", str(out),
                 "--batch-size", "30"]) == 1  # refuses to start over without --resume
    assert main(["sweep", "--model", str(path), "--device", "cpu", "--output", str(out),
                 "--batch-size", "30", "--resume", "--top", "0"]) == 0
    assert out.read_bytes() == ref.read_bytes()


def test_shards_then_merge(saved, tmp_path, capsys) -> None:
    path, ref = saved
    shards = [tmp_path / f"s{i}.parquet" for i in range(2)]
    for i, shard in enumerate(shards):
        assert main(["sweep", "--model", str(path), "--device", "cpu", "--output", str(shard),
                     "--batch-size", "30", "--shard", f"{i}/2", "--top", "0"]) == 0
    merged = tmp_path / "merged.parquet"
    assert main(["sweep", "--merge", *map(str, shards), "--output", str(merged)]) == 0
    assert merged.read_bytes() == ref.read_bytes()
    assert main(["sweep", "--model", str(path), "--output", str(tmp_path / "x.parquet"),
                 "--shard", "3/2"]) == 1
    assert "shard" in capsys.readouterr().err


def test_custom_prompts_from_a_file(saved, tmp_path) -> None:
    path, _ = saved
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Name a fruit.", "label": "fruit"}\n'
                       '{"messages": [{"role": "user", "content": "Hi"}], "label": "hi"}\n')
    out = tmp_path / "p.parquet"
    assert main(["sweep", "--model", str(path), "--device", "cpu", "--prompts-file",
                 str(prompts), "--output", str(out), "--id-range", "50:80", "--top", "0"]) == 0
    sweep = load_sweep(out)
    assert sweep.labels == ["fruit", "hi"] and sweep.token_ids.tolist() == list(range(50, 80))
