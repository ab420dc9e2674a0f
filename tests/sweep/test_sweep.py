"""Vocabulary sweep: cached scores equal naive full-sequence scores (and HF's forward)."""

from __future__ import annotations

import pytest
import torch
from transformer_lens import utilities as utils

from tl_reward.errors import TLRewardError, UnknownObjectiveError
from tl_reward.model.inputs import encode
from tl_reward.model.response_template import response_template
from tl_reward.sweep.vocab_sweep import (
    PAPER_PROMPTS,
    candidate_ids,
    score_vocabulary,
    special_token_ids,
)
from tl_reward.testing import ARCHITECTURES

CONVERSATION = [{"role": "system", "content": "Answer in one word."},
                {"role": "user", "content": "What is love?"},
                {"role": "assistant", "content": "Friendship."},
                {"role": "user", "content": "What, in one word, is the best thing ever?"}]


def naive(model, template, ids, return_type="score"):
    """The reference: each whole sequence ``prefix + [v] + suffix`` through the model."""
    seqs = torch.tensor([template.ids(v) for v in ids])
    with torch.no_grad():
        return model(seqs, attention_mask=torch.ones_like(seqs), return_type=return_type)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_cached_equals_naive_every_architecture(tiny, arch: str) -> None:
    k = 4 if arch == "armorm" else 1
    model, hf, tok = tiny(arch, k)
    prompts = {"best": PAPER_PROMPTS["best"], "chat": CONVERSATION}
    ids = candidate_ids(model)
    refs = {}
    for label, prompt in prompts.items():
        template = response_template(tok, prompt)
        refs[label] = (naive(model, template, ids),
                       naive(model, template, ids, "reward") if k > 1 else None)
        assert refs[label][0].std() > 1e-3  # tokens matter: the check can fail
    for cache, subset in (("fast", ids), ("stock", ids[::3])):
        sweep = score_vocabulary(model, prompts, subset, batch_size=96, cache=cache,
                                 progress=False)
        assert sweep.token_ids.tolist() == subset
        rows = [ids.index(i) for i in subset]
        for label, (ref_score, ref_reward) in refs.items():
            torch.testing.assert_close(sweep.values(label), ref_score[rows], atol=1e-4, rtol=0)
            if ref_reward is not None:
                p = sweep.prompt_index(label)
                torch.testing.assert_close(sweep.rewards[:, p], ref_reward[rows], atol=1e-4,
                                           rtol=0)
    # and HF's own forward, an independent implementation, on a few ids
    template = response_template(tok, CONVERSATION)
    few = ids[::40]
    seqs = torch.tensor([template.ids(v) for v in few])
    with torch.no_grad():
        out = hf(input_ids=seqs, attention_mask=torch.ones_like(seqs))
    hf_score = out.score if arch == "armorm" else out.logits[:, 0]
    torch.testing.assert_close(refs["chat"][0][::40], hf_score.float(), atol=1e-4, rtol=0)


def test_multi_objective_head_without_score(tiny) -> None:
    model, _, tok = tiny("qwen2", 3)
    sweep = score_vocabulary(model, "What is best?", batch_size=50, progress=False)
    assert sweep.scores is None and sweep.rewards.shape == (len(sweep), 1, 3)
    ref = naive(model, response_template(tok, "What is best?"), sweep.token_ids.tolist(),
                "reward")
    torch.testing.assert_close(sweep.rewards[:, 0], ref, atol=1e-4, rtol=0)
    torch.testing.assert_close(sweep.values(0, "objective_2"), ref[:, 2], atol=1e-4, rtol=0)
    with pytest.raises(UnknownObjectiveError, match="no combined score"):
        sweep.values(0)
    assert set(sweep.to_dataframe().columns) >= {"reward:prompt_0:objective_1"}


def test_template_equals_id_level_encoding(tiny) -> None:
    """prefix + [v] + suffix is what the library's own id-level templating gives."""
    model, _, tok = tiny("llama")
    template = response_template(tok, CONVERSATION)
    same = 0
    for v in candidate_ids(model):
        text = tok.decode([v])
        if not text.strip():
            continue
        ids = encode(tok, (CONVERSATION, text))
        if ids.ids[template.response_position] == v and len(ids.ids) == len(template.ids(v)):
            assert ids.ids == template.ids(v)
            assert ids.response_start == template.response_position
            same += 1
    assert same > 100


def test_candidates_exclude_special_tokens(tiny) -> None:
    model, _, tok = tiny("llama")
    special = special_token_ids(tok)
    assert {tok.bos_token_id, tok.pad_token_id, tok.convert_tokens_to_ids("<|assistant|>")} <= (
        special)
    ids = candidate_ids(model)
    assert not special & set(ids)
    assert max(ids) < len(tok) < model.cfg.d_vocab  # embedding rows without a token are left out
    everything = candidate_ids(model, include_special=True)
    assert set(everything) - set(ids) == special
    assert candidate_ids(model, [5, 3, 3]) == [3, 5]
    with pytest.raises(TLRewardError, match="must lie in"):
        candidate_ids(model, [model.cfg.d_vocab])


def test_subsets_and_prompt_forms_agree(tiny) -> None:
    model, _, _ = tiny("mistral")
    full = score_vocabulary(model, PAPER_PROMPTS, batch_size=64, progress=False)
    assert full.labels == ["greatest", "best", "worst"]
    ids = [300, 17, 42, 99]
    part = score_vocabulary(model, [PAPER_PROMPTS["worst"], PAPER_PROMPTS["best"]], ids,
                            labels=["w", "b"], batch_size=3, progress=False)
    rows = [full.token_ids.tolist().index(i) for i in ids]  # rows in the order given
    torch.testing.assert_close(part.values("w"), full.values("worst")[rows], atol=1e-5, rtol=0)
    torch.testing.assert_close(part.values("b"), full.values("best")[rows], atol=1e-5, rtol=0)
    ranged = score_vocabulary(model, PAPER_PROMPTS, id_range=(100, 130), progress=False)
    assert ranged.token_ids.tolist() == list(range(100, 130))
    df = full.to_dataframe(long=True)
    assert len(df) == 3 * len(full) and set(df["prompt"]) == {"greatest", "best", "worst"}


def test_fast_path_runs_hooks_like_the_full_forward(tiny) -> None:
    """Hooks fire in the prefix run and on the new positions, as in the full forward."""
    model, _, tok = tiny("gemma2")
    template = response_template(tok, PAPER_PROMPTS["best"])
    ids = candidate_ids(model)[:40]
    name = utils.get_act_name("mlp_out", 0)

    def ablate(act, hook):
        return torch.zeros_like(act)

    with model.hooks(fwd_hooks=[(name, ablate)]):
        cached = score_vocabulary(model, PAPER_PROMPTS["best"], ids, cache="fast",
                                  progress=False).values(0)
        ref = naive(model, template, ids)
    plain = score_vocabulary(model, PAPER_PROMPTS["best"], ids, progress=False).values(0)
    assert (cached - plain).abs().max() > 1e-2
    torch.testing.assert_close(cached, ref, atol=1e-4, rtol=0)


def test_bad_inputs_are_explained(tiny) -> None:
    model, _, _ = tiny("llama")
    with pytest.raises(TLRewardError, match="must end with a user"):
        score_vocabulary(model, CONVERSATION + [{"role": "assistant", "content": "x"}])
    with pytest.raises(TLRewardError, match="distinct label"):
        score_vocabulary(model, ["a?", "b?"], labels=["x", "x"])
    with pytest.raises(TLRewardError, match="mode"):
        score_vocabulary(model, "a?", mode="strings")
    with pytest.raises(TLRewardError, match="shard"):
        score_vocabulary(model, "a?", shard=(2, 2))


@pytest.mark.slow
def test_demo_rm_cached_equals_naive_and_hf(demo_rm) -> None:
    """The demo RM (ChatML, pad = <|im_end|> inside the suffix) on the paper's prompts."""
    from tl_reward.model.demo import demo_hf_reward_model

    model = demo_rm
    tok = model.tokenizer
    ids = list(range(0, 49152, 2999)) + [tok.convert_tokens_to_ids("ĠLove")]
    sweep = score_vocabulary(model, PAPER_PROMPTS, ids, batch_size=32, progress=False)
    template = response_template(tok, PAPER_PROMPTS["best"])
    assert len(template.prefix) == 42 and template.suffix == (2, 198)  # <|im_end|> \n
    seqs = torch.tensor([template.ids(v) for v in sweep.token_ids.tolist()])
    mask = torch.ones_like(seqs)
    assert (model.pool_positions(seqs, mask) == seqs.shape[1] - 1).all()  # reads the "\n"
    with torch.no_grad():
        ref = model(seqs, attention_mask=mask, return_type="score")
        hf, _ = demo_hf_reward_model()
        hf_ref = hf(input_ids=seqs[:6], attention_mask=mask[:6]).logits[:, 0]
    torch.testing.assert_close(sweep.values("best"), ref, atol=1e-4, rtol=0)
    torch.testing.assert_close(sweep.values("best")[:6], hf_ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_hook_free_and_hooked_fast_paths_agree(tiny, arch: str) -> None:
    """With no hook attached the fast path fuses Q/K/V, works in place and runs the last MLP at
    the pooled row only; with a hook it fires every hook point. Both equal naive scoring, and
    the in-place work never touches the shared prefix cache."""
    from tl_reward import tl_backend
    from tl_reward.sweep.vocab_sweep import score_candidates

    k = 4 if arch == "armorm" else 1
    model, _, tok = tiny(arch, k)
    template = response_template(tok, CONVERSATION)
    ids = torch.tensor(candidate_ids(model)[::7])
    cache = tl_backend.build_prefix_cache(model, torch.tensor(template.prefix), "fast")
    # every tiny architecture is served by the fast cache (a silent fall-back would skip it)
    assert cache.method == "fast", tl_backend.fast_cache_unsupported(model.cfg)
    keys = [t.clone() for t in cache.keys] + [t.clone() for t in cache.values]
    ref = naive(model, template, ids.tolist())
    assert ref.std() > 1e-3  # the tokens matter, so a wrong row or layer would show
    assert not tl_backend.hooks_active(model)
    lean = score_candidates(model, template, ids, cache)
    lean_again = score_candidates(model, template, ids, cache)
    fired: list[int] = []

    def identity(act, hook):
        fired.append(act.shape[1])
        return act

    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", identity)]):
        assert tl_backend.hooks_active(model)
        hooked = score_candidates(model, template, ids, cache)
    assert fired == [1 + len(template.suffix)]  # the hooked path ran, on the new positions
    for rewards, score in (lean, lean_again, hooked):
        torch.testing.assert_close(score if score is not None else rewards[:, 0], ref,
                                   atol=1e-4, rtol=0)
    assert torch.equal(lean[0], lean_again[0])
    for before, after in zip(keys, cache.keys + cache.values, strict=True):
        assert torch.equal(before, after)
    # final_residual_at reads the same values as the whole continuation
    new = torch.cat([ids[:, None], torch.tensor(template.suffix).expand(len(ids), -1)], 1)
    rows = torch.arange(len(ids)) % new.shape[1]
    full = tl_backend.run_after_prefix(model, cache, new)
    torch.testing.assert_close(tl_backend.final_residual_at(model, cache, new, rows),
                               full[torch.arange(len(ids)), rows], atol=1e-5, rtol=0)
    last = new.shape[1] - 1
    torch.testing.assert_close(
        tl_backend.final_residual_at(model, cache, new, torch.full_like(rows, last)),
        full[:, last], atol=1e-5, rtol=0)
