"""Train a TopK SAE on a reward model's own activations, offline, with SAELens's trainer.

SAELens's ``LanguageModelSAETrainingRunner`` streams a hub dataset through a model by name and
evaluates with a language-modelling loss, which a reward model does not have. So this module
builds the activation store itself and hands it to SAELens's ``SAETrainer`` (its documented
``data_provider`` seam), training SAELens's own ``TopKTrainingSAE``:

1. :func:`collect_activations` runs the RM on a local corpus (strings, chat conversations,
   ``(prompt, response)`` pairs; templated to token ids by the model), one forward pass for any
   number of hooks, stopping after the last block needed. Only real tokens are kept (padding
   dropped); special tokens (``<|im_start|>`` ...) are dropped by default, since their outlier
   norms (attention sinks) would dominate the reconstruction loss.
2. :func:`train_topk_sae` shuffles them into batches (seeded), initialises ``b_dec`` at the
   mean activation, trains, and returns the inference ``TopKSAE`` reloaded with
   ``SAE.load_from_disk`` (so what you analyse is exactly what is saved), with held-out
   explained variance, L0 and dead-feature share.

Nothing touches the network. Pretrained SAELens SAEs load with
``SAE.from_pretrained(release, sae_id)`` where the Hugging Face hub is reachable.

Example:
    >>> corpus = [p.chosen_conversation() for p in load_hh_rlhf(path, limit=300)]
    >>> trained = train_topk_sae(model, corpus, "blocks.20.hook_resid_post", d_sae=2048, k=32)
    >>> trained.summary()
    >>> attr = sae_attribution(model, trained.sae, pairs)
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float

from tl_reward.errors import SAEError, require_sae_lens
from tl_reward.model.inputs import EncodedInput, cached_batches
from tl_reward.results import ShortRepr


def hook_block(model: Any, hook_name: str) -> int:
    """The block a hook belongs to (``n_layers - 1`` for ``ln_final`` hooks)."""
    m = re.match(r"blocks\.(\d+)\.", hook_name)
    if m:
        return int(m.group(1))
    if hook_name in ("hook_embed", "hook_pos_embed"):
        return 0
    return model.cfg.n_layers - 1


def collect_activations(
    model: Any,
    corpus: Sequence[Any],
    hook_names: str | Sequence[str],
    batch_size: int = 8,
    max_tokens: int | None = None,
    exclude_special_tokens: bool = True,
    max_length: int | None = None,
    progress: bool | None = None,
) -> dict[str, Float[torch.Tensor, "n_tokens d"]]:
    """Activations of ``model`` at ``hook_names`` over every real token of ``corpus``.

    Args:
        corpus: inputs ``model.encode`` accepts (strings, conversations, pairs, token ids).
        hook_names: one hook or several (collected in the same forward passes).
        max_tokens: stop once this many tokens are collected.
        exclude_special_tokens: drop the tokenizer's special tokens (BOS, ``<|im_start|>``...).
        max_length: keep the first ``max_length`` tokens of each input (default: the model's
            context length).

    Returns:
        ``{hook: [n_tokens, d]}`` on CPU (inputs taken shortest first).
    """
    names = [hook_names] if isinstance(hook_names, str) else list(hook_names)
    for n in names:
        if n not in model.hook_dict:
            raise SAEError(f"{n!r} is not a hook of this model (e.g. 'blocks.3.hook_resid_post')")
    if not corpus:
        raise SAEError("the corpus is empty")
    stop = max(hook_block(model, n) for n in names) + 1
    stop_at = None if stop >= model.cfg.n_layers or any(n.startswith("ln_final") for n in names) \
        else stop
    special = torch.tensor(sorted(set(getattr(model.tokenizer, "all_special_ids", []) or [])),
                           dtype=torch.long)
    n_ctx = max_length or model.cfg.n_ctx
    encoded = [EncodedInput(model.encode(x).ids[:n_ctx]) for x in corpus]
    encoded.sort(key=lambda e: len(e.ids))  # less padding; rows are a bag of tokens anyway
    out: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    total = 0
    for batch, cache in cached_batches(model, encoded, batch_size, names,
                                       "collecting activations", progress, stop_at_layer=stop_at):
        keep = batch.attention_mask.bool()
        if exclude_special_tokens and special.numel():
            keep &= ~torch.isin(batch.tokens, special.to(batch.tokens.device))
        for n in names:
            out[n].append(cache[n][keep].detach().float().cpu())
        total += int(keep.sum())
        if max_tokens is not None and total >= max_tokens:
            break
    acts = {n: torch.cat(v) for n, v in out.items()}
    if max_tokens is not None:
        acts = {n: v[:max_tokens] for n, v in acts.items()}
    return acts


def _shuffled_batches(acts: torch.Tensor, batch_size: int, seed: int,
                      device: torch.device | str = "cpu") -> Iterator[torch.Tensor]:
    """Endless seeded epochs of shuffled ``[batch_size, d]`` batches (SAELens's data provider),
    each moved to ``device`` (the activations stay where they are)."""
    gen = torch.Generator().manual_seed(seed)
    n = acts.shape[0]
    while True:
        order = torch.randperm(n, generator=gen)
        for s in range(0, n - batch_size + 1, batch_size):
            yield acts[order[s : s + batch_size]].to(device)


@torch.no_grad()
def reconstruction_metrics(sae: Any, acts: Float[torch.Tensor, "n d"],
                           batch_size: int = 4096) -> dict[str, float]:
    """Explained variance, MSE, mean L0 and dead-feature share of ``sae`` on ``acts``."""
    sse = sst = 0.0
    l0 = 0.0
    fired = torch.zeros(sae.cfg.d_sae, dtype=torch.bool)
    mean = acts.mean(0)
    for s in range(0, acts.shape[0], batch_size):
        x = acts[s : s + batch_size].to(sae.device, sae.dtype)
        f = sae.encode(x)
        x_hat = sae.decode(f)
        sse += float((x - x_hat).pow(2).sum())
        sst += float((x - mean.to(x)).pow(2).sum())
        l0 += float((f != 0).sum())
        fired |= (f != 0).any(0).cpu()
    n = acts.shape[0]
    return {"explained_variance": 1 - sse / sst, "mse": sse / (n * acts.shape[1]),
            "l0": l0 / n, "dead_fraction": float((~fired).float().mean()), "n_tokens": n}


@dataclass(repr=False)
class TrainedSAE(ShortRepr):
    """A TopK SAE trained by :func:`train_topk_sae` and how well it reconstructs.

    Attributes:
        sae: the SAELens inference ``TopKSAE`` (as reloaded from disk).
        hook_name: the hook it reads.
        path: where it is saved (``SAE.load_from_disk(path)`` reloads it).
        train: metrics on the training tokens; ``held_out``: on the held-out tokens.
        n_training_samples: activations seen (with repeats over epochs).
    """

    sae: Any
    hook_name: str
    path: Path
    train: dict[str, float]
    held_out: dict[str, float]
    n_training_samples: int

    def summary(self) -> pd.DataFrame:
        """Train and held-out metrics side by side."""
        return pd.DataFrame({"train": self.train, "held_out": self.held_out})

    def to_dataframe(self) -> pd.DataFrame:
        """Same as :meth:`summary`, long format."""
        rows = [(split, k, v) for split, m in (("train", self.train), ("held_out",
                                                                      self.held_out))
                for k, v in m.items()]
        return pd.DataFrame(rows, columns=["split", "metric", "value"])


def train_topk_sae(
    model: Any,
    corpus: Sequence[Any] | None,
    hook_name: str,
    *,
    d_sae: int | None = None,
    k: int = 32,
    training_tokens: int | None = None,
    epochs: float = 4.0,
    batch_size_tokens: int = 1024,
    lr: float = 1e-3,
    held_out_fraction: float = 0.1,
    max_tokens: int | None = None,
    activations: Float[torch.Tensor, "n d"] | None = None,
    output_path: str | Path | None = None,
    n_checkpoints: int = 0,
    seed: int = 0,
    collect_batch_size: int = 8,
    progress: bool | None = None,
) -> TrainedSAE:
    """Train SAELens's ``TopKTrainingSAE`` on ``model``'s activations at ``hook_name``.

    Args:
        corpus: local inputs to collect activations from (or ``None`` with ``activations``).
        d_sae: number of features (default ``8 * d_in``); ``k``: active features per token.
        training_tokens: activations to train on (default ``epochs`` passes over the training
            split).
        batch_size_tokens, lr: SAELens trainer settings (constant learning rate, warm-up 5%).
        held_out_fraction: tokens kept out of training for the reported metrics.
        activations: precomputed ``[n, d_in]`` activations (e.g. from
            :func:`collect_activations`, to train several SAEs from one pass).
        output_path: where to save the SAE (``cfg.json`` + ``sae_weights.safetensors``) and
            SAELens checkpoints (``n_checkpoints`` of them); a temporary folder by default.
    """
    require_sae_lens()
    from sae_lens import SAE
    from sae_lens.config import LoggingConfig, SAETrainerConfig
    from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.training.sae_trainer import SAETrainer

    if hook_name not in model.hook_dict:
        raise SAEError(f"{hook_name!r} is not a hook of this model")
    if activations is None:
        if corpus is None:
            raise SAEError("pass a corpus or precomputed activations=")
        activations = collect_activations(model, corpus, hook_name, collect_batch_size,
                                          max_tokens, progress=progress)[hook_name]
    acts = activations.float()
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(acts.shape[0], generator=gen)
    n_held = int(round(held_out_fraction * acts.shape[0]))
    held, train = acts[order[:n_held]], acts[order[n_held:]]
    if train.shape[0] < batch_size_tokens:
        raise SAEError(
            f"only {train.shape[0]} training tokens for batches of {batch_size_tokens}; "
            "collect a larger corpus or lower batch_size_tokens"
        )
    d_in = acts.shape[1]
    total = training_tokens or int(epochs * train.shape[0])
    steps = max(1, total // batch_size_tokens)
    torch.manual_seed(seed)
    device = str(model.cfg.device)  # train where the model runs (SAELens defaults to the CPU)
    cfg = TopKTrainingSAEConfig(d_in=d_in, d_sae=d_sae or 8 * d_in, k=k, dtype="float32",
                                device=device, rescale_acts_by_decoder_norm=True)
    cfg.metadata.hook_name = hook_name
    cfg.metadata.model_name = str(getattr(model.cfg, "model_name", "reward-model"))
    cfg.metadata.exclude_special_tokens = True
    training_sae = TopKTrainingSAE(cfg)
    with torch.no_grad():
        training_sae.b_dec.copy_(train.mean(0).to(training_sae.b_dec.device))
    out = Path(output_path) if output_path is not None else Path(tempfile.mkdtemp(prefix="sae_"))
    trainer_cfg = SAETrainerConfig(
        total_training_samples=steps * batch_size_tokens,
        train_batch_size_samples=batch_size_tokens,
        lr=lr, lr_end=lr / 10, lr_warm_up_steps=max(1, steps // 20), device=device,
        dead_feature_window=max(10, steps // 4), feature_sampling_window=max(10, steps // 2),
        n_checkpoints=n_checkpoints,
        checkpoint_path=str(out / "checkpoints") if n_checkpoints else None,
        logger=LoggingConfig(log_to_wandb=False),
    )
    trainer = SAETrainer(cfg=trainer_cfg, sae=training_sae,
                         data_provider=_shuffled_batches(train, batch_size_tokens, seed, device))
    trained = trainer.fit()
    trained.save_inference_model(out)
    sae = SAE.load_from_disk(out, device=device)
    sae.eval()
    return TrainedSAE(sae=sae, hook_name=hook_name, path=out,
                      train=reconstruction_metrics(sae, train),
                      held_out=reconstruction_metrics(sae, held) if n_held else {},
                      n_training_samples=trainer.n_training_samples)
