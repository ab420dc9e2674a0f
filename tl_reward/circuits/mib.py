"""Export and import the graph JSON of EAP-IG (``eap.graph.Graph.to_json`` / ``from_json``),
the format the MIB circuit-localisation benchmark reads.

Their file: ``{"cfg": {"n_layers", "n_heads", "parallel_attn_mlp", "d_model"}, "nodes":
{name: {"in_graph": bool}}, "edges": {"src->dst" or "src->dst<q|k|v>": {"score": float,
"in_graph": bool}}}`` with nodes ``input``, ``a{l}.h{h}``, ``m{l}`` and ``logits`` (our
``reward``). Their graph is ungrouped: every query head has its own key and value input. On a
grouped-query model (``n_kv_heads < n_heads``) an edge into key/value head ``a{l}.h{kv}`` is
written as one edge into each of its ``rep = n_heads / n_kv_heads`` query heads
``a{l}.h{kv * rep + i}``, each with ``score / rep`` (the group's scores sum to the edge's, as
the gradient of a shared input is the sum over its copies) and the edge's ``in_graph``; the
file's ``cfg`` also records ``n_kv_heads`` (their loader keeps and ignores extra keys). Import
is the inverse: a group's scores are summed and the key/value edge is in the graph if any copy
is. Edges absent from a file have score 0 and are out of the graph, as in their loader, so an
export holds only the table's edges.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pandas as pd

from tl_reward.errors import TLRewardError

_EDGE = re.compile(r"^(input|a\d+\.h\d+|m\d+)->(a\d+\.h\d+|m\d+|logits)(?:<([qkv])>)?$")
_NODE = re.compile(r"^(?:input|reward|logits|a(\d+)\.h(\d+)|m(\d+))$")

Edge = tuple[str, str, str]


def _place(name: str, n_layers: int, n_heads: int) -> tuple[int, int]:
    """``(layer, stage)`` of a node in the residual stream order: input ``(-1, 0)``, heads
    ``(l, 0)``, MLPs ``(l, 1)``, reward/logits ``(n_layers, 0)``."""
    m = _NODE.match(name)
    if m is None:
        raise TLRewardError(f"node {name!r} has no place in the EAP-IG graph (input, "
                            "a{l}.h{h}, m{l}, reward); SAE feature nodes cannot be exported")
    if name == "input":
        return -1, 0
    if name in ("reward", "logits"):
        return n_layers, 0
    layer = int(m[1] if m[1] is not None else m[3])
    if not 0 <= layer < n_layers or (m[2] is not None and not 0 <= int(m[2]) < n_heads):
        raise TLRewardError(f"node {name!r} is outside the model ({n_layers} layers, "
                            f"{n_heads} heads)")
    return layer, 0 if m[1] is not None else 1


def _check(src: str, dst: str, qkv: str, n_layers: int, n_heads: int, parallel: bool) -> None:
    """Raise unless ``src -> dst`` (into ``qkv``) is an edge of their graph."""
    s, d = _place(src, n_layers, n_heads), _place(dst, n_layers, n_heads)
    into_head = dst.startswith("a")
    ok = (d > s and src not in ("reward", "logits") and qkv in (("q", "k", "v") if into_head
                                                                    else ("",))
          and not (parallel and s[0] == d[0]))
    if not ok:
        raise TLRewardError(f"{src} -> {dst} ({qkv!r}) is not an edge of the EAP-IG graph (a "
                            "source feeds later layers, a layer's MLP its own heads; qkv 'q', "
                            "'k' or 'v' into a head, '' elsewhere)")


def to_mib_json(edges_df: pd.DataFrame, n_layers: int, n_heads: int,
                in_graph: Collection[Edge] | None = None, path: str | Path | None = None, *,
                n_kv_heads: int | None = None, d_model: int | None = None,
                parallel_attn_mlp: bool = False, scoring: str | None = None) -> dict[str, Any]:
    """The EAP-IG graph dict of an edge table (columns ``src``, ``dst``, ``qkv``, ``score``),
    written to ``path`` if given (see the module doc).

    Args:
        in_graph: the ``(src, dst, qkv)`` edges of the circuit, each a row of the table (None:
            none, as EAP-IG leaves a scored graph before pruning); a node is in the graph if an
            in-graph edge touches it.
        n_kv_heads: key/value heads (grouped-query models; k/v rows then name them).
        d_model: the residual width (their loader needs it in ``cfg``).
        parallel_attn_mlp: whether a block's MLP reads its input in parallel with attention.
        scoring: how the scores were made (``EdgeAttribution.label``, e.g. ``"eap-ig (left
            rule, 5 steps)"``), written to ``cfg["scoring"]`` (their loader keeps extra keys).
    """
    if d_model is None:
        raise TLRewardError("pass d_model: EAP-IG's Graph.from_json reads it from cfg")
    missing = {"src", "dst", "qkv", "score"} - set(edges_df.columns)
    if missing:
        raise TLRewardError(f"the edge table lacks columns {sorted(missing)}")
    n_kv = n_kv_heads or n_heads
    if n_heads % n_kv:
        raise TLRewardError(f"n_heads {n_heads} is not a multiple of n_kv_heads {n_kv}")
    rep = n_heads // n_kv
    chosen = set(map(tuple, in_graph or ()))
    edges: dict[str, dict[str, Any]] = {}
    nodes_in: set[str] = {"logits"}
    for src, dst, qkv, score in zip(edges_df["src"], edges_df["dst"],
                                    edges_df["qkv"].fillna(""), edges_df["score"], strict=True):
        if qkv in ("k", "v") and rep > 1:
            layer, kv = map(int, dst[1:].split(".h"))
            if kv >= n_kv:
                raise TLRewardError(f"{dst} ({qkv}): key/value head {kv} >= n_kv_heads {n_kv}")
            dsts, share = [f"a{layer}.h{kv * rep + i}" for i in range(rep)], float(score) / rep
        else:
            dsts, share = [dst], float(score)
        on = (src, dst, qkv) in chosen
        for d in dsts:
            _check(src, d, qkv, n_layers, n_heads, parallel_attn_mlp)
            d = "logits" if d == "reward" else d
            name = f"{src}->{d}" + (f"<{qkv}>" if qkv else "")
            if name in edges:
                raise TLRewardError(f"edge {name} appears twice in the table")
            edges[name] = {"score": share, "in_graph": on}
            nodes_in |= {src, d} if on else set()
    lost = chosen - set(zip(edges_df["src"], edges_df["dst"], edges_df["qkv"].fillna(""),
                            strict=True))
    if lost:
        raise TLRewardError(
            f"{len(lost)} in-graph edges are not in the table, e.g. {sorted(lost)[:3]}: export "
            "the table the circuit was selected from (a circuit over SAE feature nodes has no "
            "EAP-IG form; save it with .save() instead)")
    cfg: dict[str, Any] = {"n_layers": n_layers, "n_heads": n_heads,
                           "parallel_attn_mlp": parallel_attn_mlp, "d_model": d_model}
    if rep > 1:
        cfg["n_kv_heads"] = n_kv
    if scoring is not None:
        cfg["scoring"] = scoring
    names = ["input", *(n for la in range(n_layers) for n in [
        *(f"a{la}.h{h}" for h in range(n_heads)), f"m{la}"]), "logits"]
    out = {"cfg": cfg, "nodes": {n: {"in_graph": n in nodes_in} for n in names}, "edges": edges}
    if path is not None:
        Path(path).write_text(json.dumps(out))
    return out


def from_mib_json(path_or_dict: str | Path | dict[str, Any], n_kv_heads: int | None = None
                  ) -> tuple[pd.DataFrame, set[Edge]]:
    """``(edge table, in-graph edges)`` of an EAP-IG graph JSON (a path or its dict): columns
    ``src``, ``dst``, ``qkv``, ``score`` sorted by ``|score|``, ``logits`` read as ``reward``;
    key/value edges regrouped onto ``n_kv_heads`` heads (default: the file's ``cfg``, else
    ungrouped), the exact inverse of :func:`to_mib_json`."""
    d = (json.loads(Path(path_or_dict).read_text()) if isinstance(path_or_dict, (str, Path))
         else path_or_dict)
    if not isinstance(d, dict) or not {"cfg", "edges"} <= set(d):
        raise TLRewardError("not an EAP-IG graph JSON: it needs 'cfg' and 'edges' keys")
    n_layers, n_heads = int(d["cfg"]["n_layers"]), int(d["cfg"]["n_heads"])
    n_kv = int(n_kv_heads or d["cfg"].get("n_kv_heads") or n_heads)
    if n_heads % n_kv:
        raise TLRewardError(f"n_heads {n_heads} is not a multiple of n_kv_heads {n_kv}")
    rep = n_heads // n_kv
    rows: dict[Edge, list[float]] = {}
    on: dict[Edge, bool] = {}
    for name, info in d["edges"].items():
        m = _EDGE.match(name)
        if m is None:
            raise TLRewardError(f"edge name {name!r} is not 'src->dst' or 'src->dst<q|k|v>'")
        src, dst, qkv = m[1], "reward" if m[2] == "logits" else m[2], m[3] or ""
        _check(src, dst, qkv, n_layers, n_heads, bool(d["cfg"].get("parallel_attn_mlp")))
        if qkv in ("k", "v") and rep > 1:
            layer, h = map(int, dst[1:].split(".h"))
            dst = f"a{layer}.h{h // rep}"
        key = (src, dst, qkv)
        rows.setdefault(key, []).append(float(info["score"]))
        on[key] = on.get(key, False) or bool(info.get("in_graph", False))
    df = pd.DataFrame([(*k, sum(v)) for k, v in rows.items()],
                      columns=["src", "dst", "qkv", "score"])
    df = df.sort_values("score", key=abs, ascending=False, kind="stable", ignore_index=True)
    return df, {k for k, v in on.items() if v}
