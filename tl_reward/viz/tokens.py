"""Per-token reward maps (HTML with a colour bar) and circuitsvis attention patterns of heads.

Both display in notebooks and save to standalone HTML with
:func:`tl_reward.viz.html.save_html`.
"""

from __future__ import annotations

import html
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tl_reward.viz.html import closed_view

_PRINTABLE = [*range(33, 127), *range(161, 173), *range(174, 256)]
#: GPT-2's byte-level BPE alphabet, symbol -> byte (``'Ġ'`` -> 32, ``'Ċ'`` -> 10): a printable
#: byte is its own symbol, the others are chr(256), chr(257), ... in byte order
_BYTES = {chr(b): b for b in _PRINTABLE} | {
    chr(256 + i): b for i, b in enumerate(b for b in range(256) if b not in _PRINTABLE)}
_SPECIAL = re.compile(r"^(<\|[^|<>]+\|>|<[/]?[a-z_]+>|\[[A-Z]+\])$")
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
#: whitespace made visible in token labels
VISIBLE = {" ": "\u00b7", "\n": "\u21b5", "\t": "\u2192", "\r": "\u240d"}


def token_label(tok: str, special: Collection[str] = ()) -> str:
    """A tokenizer symbol as the text it stands for, whitespace and special tokens visible.

    Byte-level BPE (``'Ġare'``) and SentencePiece (``'▁are'``, ``'<0x0A>'``) symbols are
    decoded; spaces show as ``·``, newlines as ``↵``, tabs as ``→``; a special token
    (in ``special``, or shaped like ``<|im_end|>``, ``</s>``, ``[CLS]``) as ``⟨im_end⟩``.

    Example:
        >>> token_label("Ġare"), token_label("Ċ"), token_label("<|im_end|>")
        ('·are', '↵', '⟨im_end⟩')
    """
    if tok in special or _SPECIAL.match(tok):
        return "\u27e8" + tok.strip("<>|[]") + "\u27e9"
    if m := _BYTE_FALLBACK.match(tok):
        text = chr(int(m[1], 16))
    else:
        try:  # byte-level BPE; a SentencePiece piece such as 'é' is not valid UTF-8 bytes
            text = bytes(_BYTES[c] for c in tok).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            text = tok.replace("\u2581", " ")
    return "".join(VISIBLE.get(c, c) for c in text)


def token_labels(tokens: Sequence[str], tokenizer: Any = None) -> list[str]:
    """:func:`token_label` of each token, the tokenizer's special tokens marked."""
    special = set(getattr(tokenizer, "all_special_tokens", None) or ())
    return [token_label(t, special) for t in tokens]


#: the ends of the diverging scale (plotly's RdBu, as in the head heatmaps) and its middle
_NEG, _MID, _POS = (178, 24, 43), (247, 247, 247), (33, 102, 172)


def _rgb(t: float) -> str:
    """The colour of ``t`` in [-1, 1]: red below 0, blue above, near-white at 0."""
    end = _POS if t > 0 else _NEG
    return "rgb({},{},{})".format(*(round(m + abs(t) * (e - m)) for m, e in zip(_MID, end,
                                                                              strict=True)))


@dataclass
class TokenMap:
    """Tokens coloured by their contribution on a scale symmetric around 0, with a colour bar
    that says what the colours mean; shows in a notebook and in :func:`save_html`."""

    labels: list[str]
    values: list[float]
    meaning: str = "direct contribution to the reward (reward units)"

    @property
    def limit(self) -> float:
        """The scale's end: the largest absolute value (1 when all are 0)."""
        return max(map(abs, self.values), default=0.0) or 1.0

    def __str__(self) -> str:
        lim = self.limit
        toks = "".join(
            f'<span title="{html.escape(t)}: {v:+.4g}" style="display:inline-block;'
            f"background:{_rgb(v / lim)};color:{'#fff' if abs(v) > 0.6 * lim else '#000'};"
            f'padding:1px 1px;margin:1px 0">{html.escape(t)}</span>'
            for t, v in zip(self.labels, self.values, strict=True))
        bar = (f'<div class="colorbar" style="display:flex;align-items:center;gap:.5em;'
               f'font-size:.85em;margin:.3em 0 1em"><span>{-lim:+.3g}</span><span style="'
               f"width:12em;height:.9em;background:linear-gradient(to right,{_rgb(-1)},"
               f'{_rgb(0)},{_rgb(1)})"></span><span>{lim:+.3g}</span><span>colour = '
               f"{html.escape(self.meaning)}: red lowers the reward, blue raises it; hover a "
               "token for its value</span></div>")
        return f'<div class="token-map"><div>{toks}</div>{bar}</div>'

    _repr_html_ = __str__


def attribution_token_map(dra: Any, index: int = 0, objective: int | str = 0,
                          head: tuple[int, int] | None = None) -> Any:
    """Reward map of input ``index`` from a ``DirectAttribution`` computed with
    ``per_position=True``: every head's direct contribution split over the source tokens it
    read (summed over heads, or one ``(layer, head)``)."""
    if dra.head_positions is None:
        raise ValueError("run direct_reward_attribution(..., per_position=True) for token maps")
    k = dra._obj(objective)
    per = dra.head_positions[index][..., k]
    vals = per.sum((0, 1)) if head is None else per[head[0], head[1]]
    return TokenMap(token_labels(dra.tokens[index][: vals.shape[0]]), vals.float().tolist())


@torch.no_grad()
def head_attention_view(model: Any, tokens: torch.Tensor | Sequence[int],
                        heads: Sequence[tuple[int, int]]) -> Any:
    """Attention patterns of ``heads`` (``(layer, head)`` pairs) on one unpadded input."""
    import circuitsvis as cv

    toks = torch.as_tensor(tokens).reshape(1, -1).to(model.cfg.device)
    layers = {la for la, _ in heads}
    _, cache = model.run_with_cache(toks, attention_mask=torch.ones_like(toks), return_type=None,
                                    names_filter=lambda n: n in {
                                        f"blocks.{la}.attn.hook_pattern" for la in layers})
    pats = torch.stack([cache[f"blocks.{la}.attn.hook_pattern"][0, h] for la, h in heads])
    strs = token_labels(model.tokenizer.convert_ids_to_tokens(toks[0].tolist()), model.tokenizer)
    return closed_view(cv.attention.attention_heads(
        pats.float().cpu(), strs, attention_head_names=[f"L{la}H{h}" for la, h in heads]))


def top_heads(dra: Any, k: int = 4, index: int = 0, objective: int | str = 0
              ) -> list[tuple[int, int]]:
    """The ``k`` heads with the largest absolute direct contribution for input ``index`` (or
    the largest absolute values of a ``[layer, head]`` tensor ``dra``)."""
    vals = dra if torch.is_tensor(dra) else dra.heads[index, ..., dra._obj(objective)]
    flat = vals.abs().flatten().argsort(descending=True)[:k]
    n_heads = vals.shape[1]
    return [(int(i) // n_heads, int(i) % n_heads) for i in flat]
