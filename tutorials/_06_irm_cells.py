# %% [markdown]
# ## Implicit reward models: what did the tuned policy learn?
#
# A policy tuned with DPO (or RLHF) against a reference carries an *implicit reward*
# (DPO's identity): `r(x, y) = beta * sum_t [log pi(y_t | x, y_<t) - log pi_ref(y_t | x, y_<t)]`
# over the response tokens only (the template's closing tokens included, the prompt not).
# The packaged pair `tl_reward.irm.load_vader_pair()` is SmolLM2-135M-Instruct and a LoRA copy
# tuned by `scripts/train_vader_policy.py` (trl DPO) on replies ordered by VADER sentiment, a
# reward whose per-token utilities are known (its lexicon). In tiny mode (`TL_REWARD_TINY=1`,
# as the tests run it) a random tiny Llama pair stands in, with a toy lexicon.

# %%
import os

import numpy as np

from tl_reward.irm.agreement import pair_agreement, rank_agreement
from tl_reward.irm.implicit import implicit_rewards
from tl_reward.irm.models import hooked_causal_lm
from tl_reward.irm.pipeline import lexicon_tokens, run_seed_pipeline
from tl_reward.irm.sweep import irm_vocab_sweep
from tl_reward.model.inputs import encode

TINY = os.environ.get("TL_REWARD_TINY") == "1"
if TINY:
    from tl_reward.sweep.lexicon import token_word
    from tl_reward.testing.causal import tiny_causal_lm_pair

    hf_policy, hf_reference, tok = tiny_causal_lm_pair("llama", seed=0)
    BETA = 0.1
    words = sorted({w for i in range(len(tok)) if (w := token_word(tok.decode([i])))})
    rng = np.random.default_rng(0)
    LEXICON = {w: float(rng.integers(-4, 5)) for w in words}

    def sentiment(texts):
        """A toy explicit reward: the mean lexicon value of the words in each text."""
        out = []
        for t in texts:
            vals = [LEXICON.get(w.strip(".,!?").lower()) for w in t.split()]
            vals = [v for v in vals if v is not None]
            out.append(float(np.mean(vals)) if vals else 0.0)
        return np.array(out)
else:
    from tl_reward.irm.policy import load_vader_pair, vader_adapter_metadata
    from tl_reward.irm.vader import vader_compound, vader_lexicon

    hf_policy, hf_reference, tok = load_vader_pair(backend="hf", return_tokenizer=True)
    BETA = float(vader_adapter_metadata()["beta"])
    LEXICON = vader_lexicon()
    sentiment = vader_compound
policy, reference = hooked_causal_lm(hf_policy, tok), hooked_causal_lm(hf_reference, tok)

# %% [markdown]
# ### Implicit rewards, token by token
# Inputs are `(prompt, response)` pairs or conversations; they are templated straight to ids,
# and only the response's tokens are summed. TransformerLens and HF models give the same
# numbers (the tests hold both to a direct HF `log_softmax` computation, either padding side).

# %%
items = [("Is the sky blue?", "Yes, the sky is blue and I love it!"),
         ("Is the sky blue?", "No. I hate that question.")]
res = implicit_rewards(policy, reference, items, BETA, padding_side="left")
print(res.rewards)
res.to_dataframe().head(12)

# %%
res.plot(0)

# %% [markdown]
# ### Does the implicit reward agree with the explicit one?
# On pairs the explicit reward orders (chosen = higher sentiment), the share the implicit reward
# orders the same way, with a bootstrap CI; and the rank correlation over a corpus.

# %%
replies = ["I love this, thank you!", "That is terrible and sad.", "Sure, here is help.",
           "No. War and hate.", "Music and friendship are great.", "I cannot help with that."]
prompt = "How was your day?"
r = implicit_rewards(policy, reference, [(prompt, x) for x in replies], BETA).rewards.numpy()
s = sentiment(replies)
order = np.argsort(-s)
chosen, rejected = order[:3], order[3:]
print("pairs:", pair_agreement(r[chosen], r[rejected], n_resamples=500))
print("corpus:", rank_agreement(r, s, n_resamples=200))

# %% [markdown]
# ### The IRM vocabulary sweep
# For a one-token reply the first term is the policy's and reference's next-token distributions
# at the response start: one forward each for the whole vocabulary. The template's closing
# tokens run per candidate against the prefix's key/value cache. `to_vocab_sweep()` makes it
# comparable with an explicit RM's sweep (`tl_reward.sweep.agreement.model_agreement`).

# %%
ids, lex_words, utils = lexicon_tokens(tok, LEXICON, policy.cfg.d_vocab)
sweep = irm_vocab_sweep(policy, reference, {"feel": "Describe how you feel in one word."},
                        BETA, ids=ids if not TINY else None, progress=False)
print(sweep.to_dataframe().nlargest(8, "reward")[["token", "reward"]])
from tl_reward.irm.vader import token_utilities  # noqa: E402

if not TINY:
    print("IRM sweep vs VADER valence:",
          rank_agreement(sweep.rewards[:, 0].numpy(), token_utilities(sweep.tokens)))

# %% [markdown]
# ### The seed paper's pipeline (arXiv 2310.08164)
# Layers ranked by parameter change; TopK SAEs (SAELens) on each model's MLP outputs there;
# ridge from SAE features of the lexicon tokens (each the whole reply to one prompt) to their
# utilities, out of fold; reconstructed vs true utility by Kendall tau-b with a CI, for the
# policy's features, the reference's and both.

# %%
texts = ["The quick brown fox jumps over the lazy dog.", "Is the sky blue? Yes.",
         "Love. Friendship. Music. Hate. War.", "Drink water, sleep well, and be kind."] * 6
if not TINY:
    texts = [f"{p} {c}" for p, c in items] * 40
corpus = [encode(tok, t) for t in texts]
pipe = run_seed_pipeline(policy, reference, corpus, LEXICON, n_layers=1,
                         d_sae=32 if TINY else 2048, k=4 if TINY else 32,
                         sae_epochs=1 if TINY else 4, batch_size_tokens=128 if TINY else 512,
                         n_folds=3, n_resamples=100)
print(pipe.layer_change.to_dataframe())
pipe.to_dataframe()

# %%
pipe.plot()
