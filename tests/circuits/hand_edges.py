"""Edge patching by hand on HF's own modules: the reference the circuits are checked against on
every family the bridge loads, under any TransformerLens (no TransformerLens, no tl_reward).

One unpadded sequence. A source's output is read off HF's forward with plain PyTorch hooks:
``input`` the residual entering the first decoder layer, head ``h`` of layer ``l`` its slice of
the output projection's input (``z``) through its columns of that projection, ``m{l}`` the MLP
module's output. A destination's input gets an addition: a head's query (key, value) input is
recomputed from the layer's attention norm of ``resid + add`` and only that head's (key/value
head's) columns of the projection output are replaced; an MLP's input is the MLP norm's input
(where attention and MLP run in parallel on one norm, the MLP's input is recomputed likewise);
``reward`` the final norm's input. The metric is the model's own output, its first objective: a
classifier's first logit, ArmoRM's and QRM's first reward before the gate; for
a causal LM read through ``lm_head_rows=[row]``, that logit at the last token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn


@dataclass
class Layout:
    """Where a family's HF modules are (see :func:`layout`)."""

    layers: Any
    final_norm: nn.Module
    attn_norm: str
    mlp_norm: str
    mlp: str
    proj: dict[str, str]  # q/k/v -> the module computing it (one module: fused)
    out: str  # the output projection (its input is z)
    conv1d: bool  # GPT-2's Conv1D (weight [in, out]) rather than nn.Linear
    head_dim: int
    n_heads: int
    n_kv: int
    column: Callable[[str, int], int]  # (q/k/v, head) -> first column in its projection

    def sub(self, layer: int, path: str) -> nn.Module:
        m = self.layers[layer]
        for part in path.split("."):
            m = getattr(m, part)
        return m


def layout(hf: nn.Module) -> Layout:
    """The :class:`Layout` of a Llama-style body (separate or fused ``qkv_proj``), GPT-2 or
    InternLM2 (its published fused ``wqkv``)."""
    body = hf.base_model if hasattr(hf, "base_model") else hf
    cfg = hf.config
    h = cfg.num_attention_heads
    k = getattr(cfg, "num_key_value_heads", None) or h
    if hasattr(body, "h"):  # GPT-2
        d = cfg.n_embd
        return Layout(body.h, body.ln_f, "ln_1", "ln_2", "mlp", dict.fromkeys("qkv", "attn.c_attn"),
                      "attn.c_proj", True, d // h, h, h,
                      lambda x, i: "qkv".index(x) * d + i * (d // h))
    layer0 = body.layers[0]
    if hasattr(layer0, "attention"):  # InternLM2: wqkv laid out [kv, groups + 2, head_dim]
        dh, g = cfg.hidden_size // h, h // k

        def internlm(x: str, i: int) -> int:
            slot = {"q": i % g, "k": g, "v": g + 1}[x]
            return ((i // g if x == "q" else i) * (g + 2) + slot) * dh
        return Layout(body.layers, body.norm, "attention_norm", "ffn_norm", "feed_forward",
                      dict.fromkeys("qkv", "attention.wqkv"), "attention.wo", False, dh, h, k,
                      internlm)
    dh = getattr(cfg, "head_dim", None) or cfg.hidden_size // h
    if hasattr(layer0.self_attn, "qkv_proj"):  # Phi-3
        return Layout(body.layers, body.norm, "input_layernorm", "post_attention_layernorm",
                      "mlp", dict.fromkeys("qkv", "self_attn.qkv_proj"), "self_attn.o_proj",
                      False, dh, h, k,
                      lambda x, i: {"q": 0, "k": h * dh, "v": (h + k) * dh}[x] + i * dh)
    return Layout(body.layers, body.norm, "input_layernorm", "post_attention_layernorm", "mlp",
                  {x: f"self_attn.{x}_proj" for x in "qkv"}, "self_attn.o_proj", False, dh, h,
                  k, lambda x, i: i * dh)


def _key(kwargs: dict[str, Any]) -> str:
    return "hidden_states" if "hidden_states" in kwargs else next(iter(kwargs))


def _first(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    """A module's first input (the hidden states), passed by position or by name."""
    return args[0] if args else kwargs[_key(kwargs)]


def _replace_first(args: tuple[Any, ...], kwargs: dict[str, Any], new: torch.Tensor
                   ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if args:
        return (new, *args[1:]), kwargs
    return args, {**kwargs, _key(kwargs): new}


@contextmanager
def _hooks(pairs: list[tuple[nn.Module, str, Callable[..., Any]]]) -> Iterator[None]:
    handles = []
    for module, kind, fn in pairs:
        if kind == "pre":
            handles.append(module.register_forward_pre_hook(fn, with_kwargs=True))
        else:
            handles.append(module.register_forward_hook(fn))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _metric(hf: nn.Module, ids: torch.Tensor, row: int | None) -> torch.Tensor:
    out = hf(input_ids=ids, attention_mask=torch.ones_like(ids))
    if row is not None:  # a causal LM read through one row of its head
        return out.logits[0, -1, row]
    rewards = getattr(out, "rewards", None)  # ArmoRM, QRM: the objectives before the gate
    return (out.logits if rewards is None else rewards).reshape(-1)[0]


def sources(hf: nn.Module, ids: list[int]) -> dict[str, torch.Tensor]:
    """Every source's output ``[pos, d_model]`` in HF's forward of ``ids``."""
    lay = layout(hf)
    seen: dict[str, torch.Tensor] = {}
    pairs: list[tuple[nn.Module, str, Callable[..., Any]]] = []

    def grab_input(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        seen["input"] = _first(args, kwargs)[0].detach()
    pairs.append((lay.layers[0], "pre", grab_input))
    for layer in range(len(lay.layers)):
        out = lay.sub(layer, lay.out)

        def grab_z(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                   layer: int = layer) -> None:
            z = _first(args, kwargs)[0].detach()
            w = mod.weight.detach()
            for h in range(lay.n_heads):
                cols = slice(h * lay.head_dim, (h + 1) * lay.head_dim)
                seen[f"a{layer}.h{h}"] = z[:, cols] @ (w[cols] if lay.conv1d else w[:, cols].T)
        pairs.append((out, "pre", grab_z))

        def grab_mlp(mod: nn.Module, args: Any, output: Any, layer: int = layer) -> None:
            seen[f"m{layer}"] = (output[0] if isinstance(output, tuple) else output)[0].detach()
        pairs.append((lay.sub(layer, lay.mlp), "fwd", grab_mlp))
    with torch.no_grad(), _hooks(pairs):
        hf(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return seen


def patched_metric(hf: nn.Module, ids: list[int], dst: str, qkv: str, add: torch.Tensor,
                   embed: torch.Tensor | None = None, row: int | None = None) -> torch.Tensor:
    """The metric with ``add`` (``[pos, d_model]``) added to the input of ``(dst, qkv)`` only
    (differentiable in ``add``); ``embed`` replaces the residual entering the first layer."""
    lay = layout(hf)
    pairs: list[tuple[nn.Module, str, Callable[..., Any]]] = []
    if embed is not None:
        def put(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            x = _first(args, kwargs)
            return _replace_first(args, kwargs, embed[None].to(x.dtype))
        pairs.append((lay.layers[0], "pre", put))

    def plus(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return _replace_first(args, kwargs, _first(args, kwargs) + add[None])
    if dst == "reward":
        pairs.append((lay.final_norm, "pre", plus))
        return _run(hf, ids, row, pairs)
    layer = int(dst[1:].split(".h")[0])
    mlp_norm = getattr(lay.layers[layer], lay.mlp_norm, None)
    if dst.startswith("m") and mlp_norm is not None:
        pairs.append((mlp_norm, "pre", plus))
        return _run(hf, ids, row, pairs)
    resid: dict[str, torch.Tensor] = {}

    def keep(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        resid["x"] = _first(args, kwargs)
    pairs.append((lay.layers[layer], "pre", keep))
    norm = lay.sub(layer, lay.attn_norm)
    if dst.startswith("m"):  # parallel attention and MLP: the MLP reads the attention's norm
        def renorm(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return _replace_first(args, kwargs, norm(resid["x"] + add[None]))
        pairs.append((lay.sub(layer, lay.mlp), "pre", renorm))
    else:
        head = int(dst.split(".h")[1])
        proj = lay.sub(layer, lay.proj[qkv])

        def swap(mod: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
            x = norm(resid["x"] + add[None])
            new = x @ mod.weight + mod.bias if lay.conv1d else F.linear(x, mod.weight, mod.bias)
            c = lay.column(qkv, head)
            return torch.cat([output[..., :c], new[..., c : c + lay.head_dim],
                              output[..., c + lay.head_dim :]], -1)
        pairs.append((proj, "fwd", swap))
    return _run(hf, ids, row, pairs)


def _run(hf: nn.Module, ids: list[int], row: int | None,
         pairs: list[tuple[nn.Module, str, Callable[..., Any]]]) -> torch.Tensor:
    with _hooks(pairs):
        return _metric(hf, torch.tensor([ids]), row)


def edge_score(hf: nn.Module, clean: list[int], corrupt: list[int], src: str, dst: str,
               qkv: str, row: int | None = None) -> float:
    """Exact patching by hand: ``metric(src's corrupted-minus-clean output added to dst's input
    only) - metric(clean)``."""
    a, b = sources(hf, clean), sources(hf, corrupt)
    with torch.no_grad():
        zero = torch.zeros_like(a[src])
        return float(patched_metric(hf, clean, dst, qkv, b[src] - a[src], row=row)
                     - patched_metric(hf, clean, dst, qkv, zero, row=row))


def edge_gradient(hf: nn.Module, clean: list[int], corrupt: list[int], src: str, dst: str,
                  qkv: str, alphas: list[float] | None, row: int | None = None) -> float:
    """EAP (``alphas`` None: the gradient at the clean run) or EAP-IG by hand: ``(a_src(corrupt)
    - a_src(clean)) . mean_alpha dM/d(in_dst)`` with the first layer's input at ``corrupt +
    alpha (clean - corrupt)``."""
    a, b = sources(hf, clean), sources(hf, corrupt)
    grads = []
    for alpha in [None] if alphas is None else alphas:
        eps = torch.zeros_like(a[src], requires_grad=True)
        embed = None if alpha is None else b["input"] + alpha * (a["input"] - b["input"])
        (g,) = torch.autograd.grad(patched_metric(hf, clean, dst, qkv, eps, embed, row), eps)
        grads.append(g)
    return float(((b[src] - a[src]) * torch.stack(grads).mean(0)).sum())
