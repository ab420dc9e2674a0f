"""The model builds every scored sequence, and every reward is read one way (issue 17).

Each test names the wrong number it guards against; the reference is the model's own
``encode``/``rewards`` of the same conversation (both checked against HF's forward elsewhere),
HF's head applied by hand, or the same analysis at another batch size.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from helpers import CONVERSATIONS, parity_atol

from tl_reward import HookedRewardModel
from tl_reward.errors import TLRewardError
from tl_reward.model.readout import default_objectives
from tl_reward.testing import save_tiny_reward_model, tiny_hf_reward_model
from tl_reward.testing.tiny import ARCHITECTURES, CHAT_TEMPLATE, tiny_tokenizer

PROMPT = "What, in one word, is the greatest thing ever?"
CUSTOM = ("inform", "qrm", "internlm2")


@pytest.fixture(scope="module")
def custom(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``custom(arch, num_labels)``: a custom-code tiny RM loaded from disk, cached."""
    made: dict[tuple[str, int], HookedRewardModel] = {}

    def load(arch: str, num_labels: int = 1) -> HookedRewardModel:
        if (arch, num_labels) not in made:
            path = save_tiny_reward_model(tmp_path_factory.mktemp(arch), arch, num_labels, seed=3)
            made[arch, num_labels] = HookedRewardModel.from_pretrained(
                str(path), device="cpu", trust_remote_code=True)
        return made[arch, num_labels]

    return load


def _model(arch: str, tiny: Any, custom: Any) -> HookedRewardModel:
    if arch in CUSTOM:
        return custom(arch)
    return tiny(arch, 3 if arch == "armorm" else 1)[0]


def _bosless(model: HookedRewardModel, tokenizer_adds_bos: bool = True) -> HookedRewardModel:
    """The model with a chat template that writes no BOS, beside a tokenizer that adds one
    (Skywork-Reward-V2's card: the template string is tokenised with the tokenizer's BOS) or,
    Qwen3-style, adds none either."""
    from tokenizers import processors

    tok = copy.deepcopy(model.tokenizer)
    tok.chat_template = CHAT_TEMPLATE.replace("{{ bos_token }}", "")
    if not tokenizer_adds_bos:
        tok.backend_tokenizer.post_processor = processors.TemplateProcessing(single="$A",
                                                                             pair="$A $B")
    assert (tok("hi")["input_ids"][0] == tok.bos_token_id) is tokenizer_adds_bos
    other = copy.copy(model)
    other.tokenizer = tok
    return other


def _sweep_vs_rewards(model: HookedRewardModel, n: int = 40) -> None:
    """Every sampled token that survives the text round trip scores in the sweep what
    ``model.rewards`` gives the conversation whose reply is that token."""
    from tl_reward.sweep.vocab_sweep import candidate_ids, score_vocabulary

    tok = model.tokenizer
    ids = candidate_ids(model)[::5][:n]
    texts = {v: tok.decode([v]) for v in ids}
    survive = [v for v in ids if texts[v].strip()
               and tok.encode(texts[v], add_special_tokens=False) == [v]]
    encoded = {v: model.encode((PROMPT, texts[v])).ids for v in survive}
    tpl = model.response_template(PROMPT)
    same = [v for v in survive if encoded[v] == tpl.ids(v)]
    assert len(survive) >= 10 and len(same) == len(survive), (len(survive), len(same))
    want = model.rewards([(PROMPT, texts[v]) for v in same], batch_size=8)
    want_v = want.score if want.score is not None else want.rewards[:, 0]
    for cache in ("auto", "none"):
        sweep = score_vocabulary(model, PROMPT, same, cache=cache, batch_size=16, progress=False)
        got = sweep.values(0, "score" if want.score is not None else 0)
        torch.testing.assert_close(got, want_v, atol=parity_atol(want_v, model.cfg.n_layers),
                                   rtol=0)
    assert want_v.std() > 10 * parity_atol(want_v, model.cfg.n_layers)  # the token matters


@pytest.mark.parametrize("arch", [*ARCHITECTURES, *CUSTOM])
def test_sweep_scores_the_sequence_encode_builds(arch: str, tiny: Any, custom: Any) -> None:
    """InternLM2: the sweep read every value without the reward token (2.65 vs -0.19)."""
    _sweep_vs_rewards(_model(arch, tiny, custom))


@pytest.mark.parametrize("arch", ["llama", "qwen3", "internlm2"])
@pytest.mark.parametrize("adds_bos", [True, False], ids=["tokenizer-bos", "qwen3-style"])
def test_sweep_keeps_one_bos_with_a_bosless_template(arch: str, adds_bos: bool, tiny: Any,
                                                     custom: Any) -> None:
    """A template without BOS, a tokenizer that adds one: ``encode`` gives one BOS; the sweep
    scored the sequence without it (0.437 vs 0.677). Qwen3-style (neither adds one): no BOS
    anywhere."""
    model = _bosless(_model(arch, tiny, custom), adds_bos)
    tpl = model.response_template(PROMPT)
    bos = model.tokenizer.bos_token_id
    assert tpl.prefix.count(bos) == int(adds_bos) and (tpl.prefix[0] == bos) is adds_bos
    _sweep_vs_rewards(model)


def test_irm_sweep_keeps_one_bos() -> None:
    """The IRM sweep equals ``implicit_rewards`` of the conversations ``encode`` builds (the
    sweep skipped the one-BOS rule: 0.405 vs 0.357)."""
    from tl_reward.irm.implicit import implicit_rewards
    from tl_reward.irm.sweep import irm_vocab_sweep
    from tl_reward.testing.causal import tiny_causal_lm_pair

    tok = tiny_tokenizer()
    tok.chat_template = CHAT_TEMPLATE.replace("{{ bos_token }}", "")
    policy, reference, _ = tiny_causal_lm_pair("llama", seed=5)
    ids = [v for v in range(20, 200, 3)
           if tok.encode(tok.decode([v]), add_special_tokens=False) == [v]][:30]
    sweep = irm_vocab_sweep(policy, reference, PROMPT, 0.5, tokenizer=tok, ids=ids,
                            progress=False)
    want = implicit_rewards(policy, reference, [(PROMPT, tok.decode([v])) for v in ids], 0.5,
                            tokenizer=tok).rewards
    torch.testing.assert_close(sweep.rewards[:, 0], want, atol=1e-4, rtol=1e-4)
    assert (sweep.rewards[:, 0] - want).abs().max() < 0.1 * want.std()


def test_token_ids_are_taken_as_given_in_any_container(custom: Any) -> None:
    """``encode`` appended InternLM2's reward token to a tuple of ids, not to a list."""
    model = custom("internlm2")
    ids = model.encode(CONVERSATIONS[0]).ids
    assert ids[-1] == model.suffix_ids[0]  # text gets the reward token
    for form in (ids, tuple(ids), torch.tensor(ids)):
        assert model.encode(form).ids == ids
    r = [model.rewards(form).rewards for form in (ids, tuple(ids), torch.tensor(ids))]
    assert torch.equal(r[0], r[1]) and torch.equal(r[0], r[2])


def test_build_gives_mask_aware_pooled_positions(tiny: Any) -> None:
    model = tiny("llama")[0]
    for side in ("right", "left"):
        batch = model.build(CONVERSATIONS, padding_side=side)
        assert batch.pooled is not None
        assert torch.equal(batch.pooled,
                           model.pool_positions(batch.tokens, batch.attention_mask))
        offsets = batch.offsets()
        for i, conv in enumerate(CONVERSATIONS):  # the same token of the unpadded text
            alone = model.build(conv)
            assert batch.tokens[i, batch.pooled[i]] == alone.tokens[0, alone.pooled[0]]
            assert int(batch.pooled[i] - offsets[i]) == int(alone.pooled[0])


@pytest.mark.parametrize("pooling", ["hf", "legacy", "mask"])
def test_mlp_head_never_read_at_a_pad(pooling: str, custom: Any) -> None:
    """With ``pooling="mask"`` the MLP head was linearised at ``pool_positions(tokens)`` without
    the mask (a pad column): concept slope 0.036 at batch size 1 vs 0.021 at 2; steering base
    1.26 vs ``model.rewards`` 0.87."""
    from tl_reward.audit.concepts import concept_alignment, concept_vector, steering_curve

    model = copy.copy(custom("inform"))
    model.pooling = pooling
    inputs = [c[-2:] if c[0]["role"] == "system" else c for c in CONVERSATIONS]
    pos = [("Tell me something kind.", "You are wonderful and I like you."),
           ("Say a nice word.", "Friendship.")]
    neg = [("Tell me something kind.", "No."), ("Say a nice word.", "Hate.")]
    concept = concept_vector(model, pos, neg, layer=1, name="kind")
    want = model.rewards(inputs, batch_size=1).score
    slopes = []
    for bs in (1, 3):
        curve = steering_curve(model, concept, inputs, alphas=(1.0,), batch_size=bs)
        torch.testing.assert_close(curve.base, want, atol=1e-5, rtol=0)
        slopes.append(concept_alignment(model, concept, inputs, separability=False,
                                        batch_size=bs).slope)
    torch.testing.assert_close(slopes[0], slopes[1], atol=1e-5, rtol=1e-4)
    for bs in (1, 3, 8):
        for side in ("right", "left"):
            got = model.rewards(inputs, batch_size=bs, padding_side=side).score
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    batch = model.build(inputs)
    last = torch.full_like(batch.pooled, batch.tokens.shape[1] - 1)
    assert (last != batch.pooled).any()  # a padded row: the old default read a pad column
    with pytest.raises(TLRewardError, match="positions="):
        model.reward_direction("score", torch.zeros(3, 4, model.cfg.d_model), batch.tokens)


def test_has_score_is_decided_once(tiny: Any, custom: Any) -> None:
    """An MLP head with K = 2 has no score: probes raised AttributeError, the sweep KeyError,
    geometric conflict read the NaN ``W_U`` and said "undetermined"."""
    from tl_reward.audit.conflict import geometric_conflict
    from tl_reward.audit.perturbations import user_items
    from tl_reward.audit.probes import reward_names, run_probes
    from tl_reward.sweep.vocab_sweep import score_vocabulary

    cases = {"llama": (tiny("llama")[0], True), "llama K=2": (tiny("llama", 2)[0], False),
             "armorm": (tiny("armorm", 3)[0], True), "inform": (custom("inform"), True),
             "inform K=2": (custom("inform", 2), False)}
    for name, (model, has) in cases.items():
        assert model.has_score is has, name
        names = list(model.objectives)
        assert reward_names(model) == (["score"] if has else []) + names
        if len(names) > 1:
            assert default_objectives(model) == (["score"] if has else []) + names
    mlp2 = custom("inform", 2)
    items = user_items([("Why is the sky blue?", "Sunlight scatters off air."),
                        ("Can cats swim?", "Most cats can swim. Few enjoy it.")])
    rep = run_probes(mlp2, items, ["length"], n_permutations=4995)
    assert rep.objective == mlp2.objectives[0]
    want = mlp2.rewards([(it.user_turn, it.reply) for it in items]).rewards
    nat = rep.rows[rep.rows.dimension == "__natural__"]
    col = f"neutral:{mlp2.objectives[1]}"
    if col in nat:
        torch.testing.assert_close(torch.tensor(nat[col].to_numpy(), dtype=torch.float32),
                                   want[:, 1], atol=1e-5, rtol=0)
    sweep = score_vocabulary(mlp2, PROMPT, list(range(20, 40)), progress=False)
    assert sweep.scores is None and sweep.rewards.shape == (20, 1, 2)
    with pytest.raises(TLRewardError, match="MLP"):
        geometric_conflict(mlp2)


def test_bf16_rewards_are_read_in_float32() -> None:
    """``model.rewards`` ran the head in bf16: rewards of |r| ~ 16 came in steps of 0.0625 and a
    sweep's ranking tied. Now they equal HF's RMSNorm and the model's head applied by hand, in
    float64, to the model's own bf16 final residual (float32 tolerance: 1e-5 relative on
    |r| <= 32, where bf16 would be off by up to 0.125), and ties are as rare as in float32."""
    from tl_reward.sweep.vocab_sweep import score_vocabulary

    hf, tok = tiny_hf_reward_model("llama", seed=0)
    with torch.no_grad():
        hf.score.weight.mul_(24.0)  # rewards of order 10-30: bf16 steps of 0.06-0.125
    model = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu",
                                              dtype=torch.bfloat16)
    batch = model.build(CONVERSATIONS)
    got = model.rewards(CONVERSATIONS).rewards[:, 0]
    with torch.no_grad():
        resid = model(batch.tokens, attention_mask=batch.attention_mask,
                      stop_at_layer=model.cfg.n_layers)
    h = resid[torch.arange(3), batch.pooled].double()
    eps = hf.config.rms_norm_eps  # HF's RMSNorm by hand, on the bf16 model's own head weights
    by_hand = ((h / (h.pow(2).mean(-1, keepdim=True) + eps).sqrt()) @ model.W_U.double()
               + model.b_U.double())
    assert got.dtype == torch.float32 and got.abs().max() > 8
    torch.testing.assert_close(got.double(), by_hand[:, 0], atol=1e-5 * 32, rtol=0)
    assert (got - got.bfloat16().float()).abs().max() > 1e-3  # not on the bf16 grid
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sweep = score_vocabulary(model, PROMPT, list(range(20, 220)), progress=False)
    vals = sweep.values(0)
    assert vals.unique().numel() >= 195  # bf16-rounded rewards tie dozens of times here


@pytest.mark.parametrize("arch", [*ARCHITECTURES, *CUSTOM])
def test_rewards_do_not_depend_on_batching(arch: str, tiny: Any, custom: Any) -> None:
    """Batch sizes 1, 3 and 8 and both padding sides give each input's unpadded reward."""
    model = _model(arch, tiny, custom)
    inputs = [*CONVERSATIONS, *[(PROMPT, w) for w in ("Love.", "Music and friendship.", "War")]]
    alone = torch.cat([model.rewards(x).rewards for x in inputs])
    scale = parity_atol(alone, model.cfg.n_layers)
    for bs in (1, 3, 8):
        for side in ("right", "left"):
            got = model.rewards(inputs, batch_size=bs, padding_side=side).rewards
            torch.testing.assert_close(got, alone, atol=scale, rtol=0)
    assert alone.std(0).min() > 10 * scale  # inputs differ by far more than the tolerance


def test_sweep_keeps_the_given_order_and_takes_token_strings(tiny: Any) -> None:
    """``score_vocabulary`` returned rows sorted by id, and token strings raised
    ``invalid literal for int()``."""
    from tl_reward.sweep.vocab_sweep import score_vocabulary

    model = tiny("llama")[0]
    tok = model.tokenizer
    word = next(w for w in (" blue", " sky", " the")
                if len(tok.encode(w, add_special_tokens=False)) == 1)
    wid = tok.encode(word, add_special_tokens=False)[0]
    ids = [90, 31, word, 200, 31]
    sweep = score_vocabulary(model, PROMPT, ids, progress=False)
    assert sweep.token_ids.tolist() == [90, 31, wid, 200]
    ref = score_vocabulary(model, PROMPT, sorted({90, 31, wid, 200}), progress=False)
    by_id = dict(zip(ref.token_ids.tolist(), ref.values(0).tolist(), strict=True))
    assert sweep.values(0).tolist() == [by_id[v] for v in (90, 31, wid, 200)]
    with pytest.raises(TLRewardError, match="not one"):
        score_vocabulary(model, PROMPT, ["the quick brown fox"], progress=False)
