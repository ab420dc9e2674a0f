"""Sweep files: interrupted sweeps resume to the identical file; shards merge into one run."""

from __future__ import annotations

import pytest
import torch

from tl_reward.sweep.store import SweepStoreError, merge_sweeps, parts_dir, read_spec
from tl_reward.sweep.vocab_sweep import PAPER_PROMPTS, load_sweep, score_vocabulary


class Interrupt(Exception):
    pass


def sweep(model, **kw):
    return score_vocabulary(model, PAPER_PROMPTS, batch_size=40, progress=False, **kw)


@pytest.fixture(scope="module")
def reference(tiny, tmp_path_factory):
    model = tiny("qwen2")[0]
    path = tmp_path_factory.mktemp("ref") / "ref.parquet"
    return model, sweep(model, output=path), path


def test_interrupted_sweep_resumes_to_the_identical_file(reference, tmp_path) -> None:
    model, ref, ref_path = reference
    out = tmp_path / "run.parquet"

    def stop(done: int, total: int) -> None:
        if done >= 120:
            raise Interrupt

    with pytest.raises(Interrupt):
        sweep(model, output=out, callback=stop)
    parts = parts_dir(out)
    assert not out.exists() and len(list(parts.glob("chunk-*.parquet"))) == 3
    (parts / "chunk-0000003.tmp").write_bytes(b"half-written")  # as if killed mid-write
    with pytest.raises(SweepStoreError, match="resume=True"):
        sweep(model, output=out)
    seen: list[int] = []
    resumed = sweep(model, output=out, resume=True, callback=lambda d, t: seen.append(d))
    assert seen[0] == 160 and seen[-1] == len(ref)  # only the missing chunks ran
    assert out.read_bytes() == ref_path.read_bytes()
    assert not parts.exists()
    assert resumed.token_ids.unique().numel() == len(resumed) == len(ref)
    assert torch.equal(resumed.scores, ref.scores)
    again: list[int] = []
    done = sweep(model, output=out, resume=True, callback=lambda d, t: again.append(d))
    assert again == [] and torch.equal(done.scores, ref.scores)  # finished: nothing re-run


def test_resume_refuses_other_settings(reference, tmp_path) -> None:
    model, _, _ = reference
    out = tmp_path / "run.parquet"

    def stop(done: int, total: int) -> None:
        raise Interrupt

    with pytest.raises(Interrupt):
        sweep(model, output=out, callback=stop)
    with pytest.raises(SweepStoreError, match="batch_size"):
        score_vocabulary(model, PAPER_PROMPTS, batch_size=50, output=out, resume=True,
                         progress=False)
    with pytest.raises(SweepStoreError, match="prompts"):
        score_vocabulary(model, {**PAPER_PROMPTS, "worst": "Worst?"}, batch_size=40,
                         output=out, resume=True, progress=False)
    fresh = sweep(model, output=out, overwrite=True)
    assert out.exists() and len(fresh) > 0


def test_shards_merge_into_one_run(reference, tmp_path) -> None:
    model, ref, ref_path = reference
    paths = [tmp_path / f"shard{i}.parquet" for i in range(3)]
    for i, path in enumerate(paths):
        sweep(model, output=path, shard=(i, 3))
    ranges = [read_spec(p).id_range for p in paths]
    assert ranges[0][0] == 0 and ranges[-1][1] == model.cfg.d_vocab
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    merged = merge_sweeps(list(reversed(paths)), tmp_path / "merged.parquet")
    assert merged.read_bytes() == ref_path.read_bytes()
    assert torch.equal(load_sweep(merged).scores, ref.scores)
    with pytest.raises(SweepStoreError, match="overlap"):
        merge_sweeps([paths[0], paths[0]], tmp_path / "bad.parquet")
    with pytest.raises(SweepStoreError, match="gap"):
        merge_sweeps([paths[0], paths[2]], tmp_path / "bad.parquet")
    other = tmp_path / "other.parquet"
    score_vocabulary(model, "Another prompt?", batch_size=40, shard=(1, 3), output=other,
                     progress=False)
    with pytest.raises(SweepStoreError, match="prompts"):
        merge_sweeps([paths[0], other], tmp_path / "bad.parquet")


def test_saved_sweep_loads_back(reference, tmp_path) -> None:
    _, ref, ref_path = reference
    path = ref.save(tmp_path / "copy.parquet")
    assert path.read_bytes() == ref_path.read_bytes()
    back = load_sweep(path)
    assert back.labels == ["greatest", "best", "worst"] and back.tokens == ref.tokens
    assert back.prompts[1][0]["content"] == PAPER_PROMPTS["best"]
    with pytest.raises(SweepStoreError, match="no sweep file"):
        load_sweep(tmp_path / "missing.parquet")


def _other_model(pooling: str = "hf", body_change: bool = False):
    from tl_reward import HookedRewardModel
    from tl_reward.testing import tiny_hf_reward_model

    hf, tok = tiny_hf_reward_model("qwen2", num_labels=1, seed=0)
    model = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu",
                                              pooling=pooling)
    if body_change:
        with torch.no_grad():  # one weight of the body: head and embedding untouched
            model.blocks[1].attn.W_O[0, 0, 0] += 0.5
    return model


def test_resume_and_merge_refuse_another_model(reference, tmp_path) -> None:
    """A model that differs only in one body weight, or only in its pooling rule, may neither
    resume nor be merged into another model's sweep (the old fingerprint hashed only the head
    and a sample of the embedding, and the spec had no pooling rule)."""
    model, _, _ = reference
    out = tmp_path / "run.parquet"
    with pytest.raises(Interrupt):
        sweep(model, output=out, callback=lambda d, t: (_ for _ in ()).throw(Interrupt))
    body = _other_model(body_change=True)
    with pytest.raises(SweepStoreError, match="model_fingerprint"):
        sweep(body, output=out, resume=True)
    with pytest.raises(SweepStoreError, match="pooling"):
        sweep(_other_model(pooling="mask"), output=out, resume=True)
    shard0, shard1 = tmp_path / "s0.parquet", tmp_path / "s1.parquet"
    sweep(model, output=shard0, shard=(0, 2))
    sweep(body, output=shard1, shard=(1, 2))
    with pytest.raises(SweepStoreError, match="model_fingerprint"):
        merge_sweeps([shard0, shard1], tmp_path / "bad.parquet")
    sweep(_other_model(pooling="mask"), output=shard1, shard=(1, 2), overwrite=True)
    with pytest.raises(SweepStoreError, match="pooling"):
        merge_sweeps([shard0, shard1], tmp_path / "bad.parquet")


def test_resume_refuses_another_tokenizer(reference, tmp_path) -> None:
    """Issue 17: the spec now records the tokenizer (vocabulary, specials, chat template), so a
    sweep resumed under another tokenizer is refused, naming it."""
    model, _, _ = reference
    out = tmp_path / "run.parquet"
    with pytest.raises(Interrupt):
        sweep(model, output=out, callback=lambda d, t: (_ for _ in ()).throw(Interrupt))
    other = _other_model()
    assert other.tokenizer is not model.tokenizer
    other.tokenizer.chat_template = other.tokenizer.chat_template + " "
    with pytest.raises(SweepStoreError, match="tokenizer") as err:
        sweep(other, output=out, resume=True)
    assert "model_fingerprint" not in str(err.value)  # the same weights: only the tokenizer
    from tl_reward.store import StoreMismatchError

    assert isinstance(err.value, StoreMismatchError)  # the one refusal of every store


def test_a_hooked_sweep_never_resumes(reference, tmp_path) -> None:
    """Issue 28: a sweep killed under a zero-ablation hook and resumed without it wrote a
    half-ablated file. Attachments are part of the run: resuming with or without the hook is
    refused naming it; a fresh run without the hook is the reference."""
    model, ref, ref_path = reference
    out = tmp_path / "run.parquet"

    def stop(done: int, total: int) -> None:
        if done >= 120:
            raise Interrupt

    handle = model.blocks[0].mlp.register_forward_hook(lambda m, i, o: o * 0)
    try:
        with pytest.raises(Interrupt):
            sweep(model, output=out, callback=stop)
        with pytest.raises(SweepStoreError, match=r"blocks\.0\.mlp"):  # the same hook again
            sweep(model, output=out, resume=True)
    finally:
        handle.remove()
    with pytest.raises(SweepStoreError, match=r"blocks\.0\.mlp") as err:
        sweep(model, output=out, resume=True)
    assert "overwrite=True" in str(err.value) and not out.exists()
    fresh = sweep(model, output=out, overwrite=True)
    assert out.read_bytes() == ref_path.read_bytes() and torch.equal(fresh.scores, ref.scores)
    finished = tmp_path / "hooked.parquet"  # a finished hooked file is not reused either
    handle = model.blocks[0].mlp.register_forward_hook(lambda m, i, o: o * 0)
    try:
        hooked = sweep(model, output=finished)
        assert not torch.allclose(hooked.scores, ref.scores)
    finally:
        handle.remove()
    with pytest.raises(SweepStoreError, match=r"blocks\.0\.mlp"):
        sweep(model, output=finished, resume=True)
