"""EAP-IG / MIB graph JSON: the exported edge set is theirs, a round trip is exact, and a file
written by hand in their format loads to the right table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tl_reward.circuits.mib import from_mib_json, to_mib_json
from tl_reward.errors import TLRewardError

L, H, KV, D = 3, 4, 2, 64


def their_edge_names(n_layers: int, n_heads: int) -> set[str]:
    """EAP-IG's ``Graph.from_model`` edge names (serial attention and MLP), written out."""
    names, stream = set(), ["input"]
    for la in range(n_layers):
        heads = [f"a{la}.h{h}" for h in range(n_heads)]
        names |= {f"{s}->{h}<{x}>" for s in stream for h in heads for x in "qkv"}
        stream += heads
        names |= {f"{s}->m{la}" for s in stream}
        stream.append(f"m{la}")
    return names | {f"{s}->logits" for s in stream}


def grouped_table(seed: int = 0) -> pd.DataFrame:
    """Every edge of the grouped graph (k/v into key/value heads), random scores."""
    rng = np.random.default_rng(seed)
    rows, stream = [], ["input"]
    for la in range(L):
        rows += [(s, f"a{la}.h{h}", "q") for s in stream for h in range(H)]
        rows += [(s, f"a{la}.h{kv}", x) for s in stream for kv in range(KV) for x in "kv"]
        stream += [f"a{la}.h{h}" for h in range(H)]
        rows += [(s, f"m{la}", "") for s in stream]
        stream.append(f"m{la}")
    rows += [(s, "reward", "") for s in stream]
    df = pd.DataFrame(rows, columns=["src", "dst", "qkv"])
    df["score"] = rng.standard_normal(len(df))
    return df.sort_values("score", key=abs, ascending=False, kind="stable", ignore_index=True)


def test_round_trip_is_exact_and_the_edges_are_theirs(tmp_path: Path) -> None:
    df = grouped_table()
    chosen = set(map(tuple, df[["src", "dst", "qkv"]].head(20).to_numpy().tolist()))
    d = to_mib_json(df, L, H, chosen, tmp_path / "g.json", n_kv_heads=KV, d_model=D)
    assert set(d["edges"]) == their_edge_names(L, H)  # ungrouped: every query head's k and v
    assert d["cfg"] == {"n_layers": L, "n_heads": H, "parallel_attn_mlp": False, "d_model": D,
                        "n_kv_heads": KV}
    assert list(d["nodes"])[-1] == "logits" and d["nodes"]["logits"]["in_graph"]
    k = df[(df.qkv == "k") & (df.src == "m0") & (df.dst == "a1.h1")].score.item()
    assert d["edges"]["m0->a1.h2<k>"]["score"] == d["edges"]["m0->a1.h3<k>"]["score"] == k / 2
    for path_or_dict in (tmp_path / "g.json", str(tmp_path / "g.json"), d):
        back, on = from_mib_json(path_or_dict)
        pd.testing.assert_frame_equal(back, df, check_exact=True)  # k / 2 + k / 2 == k exactly
        assert on == chosen
    touched = {n for s, t, _ in chosen for n in (s, "logits" if t == "reward" else t)}
    assert {n for n, v in d["nodes"].items() if v["in_graph"]} == touched | {"logits"}


def test_three_query_heads_per_key_value_head_sum_back() -> None:
    df = pd.DataFrame({"src": ["input", "input"], "dst": ["a0.h1", "a0.h4"],
                       "qkv": ["v", "q"], "score": [0.1, -0.3]})
    d = to_mib_json(df, 1, 6, n_kv_heads=2, d_model=D)
    assert [d["edges"][f"input->a0.h{h}<v>"]["score"] for h in (3, 4, 5)] == [0.1 / 3] * 3
    back, on = from_mib_json(d)
    assert back.score.tolist() == pytest.approx([-0.3, 0.1], rel=1e-15, abs=0)
    assert back[["src", "dst", "qkv"]].values.tolist() == [["input", "a0.h4", "q"],
                                                           ["input", "a0.h1", "v"]]
    assert on == set()


def test_a_hand_written_file_in_their_format_loads() -> None:
    their = {  # what EAP-IG's Graph.to_json writes for a 1-layer, 2-head model (some edges)
        "cfg": {"n_layers": 1, "n_heads": 2, "parallel_attn_mlp": False, "d_model": 8},
        "nodes": {"input": {"in_graph": True}, "a0.h0": {"in_graph": True},
                  "a0.h1": {"in_graph": False}, "m0": {"in_graph": True},
                  "logits": {"in_graph": True}},
        "edges": {"input->a0.h0<q>": {"score": 0.25, "in_graph": True},
                  "input->a0.h1<k>": {"score": -0.5, "in_graph": False},
                  "input->a0.h0<k>": {"score": 0.125, "in_graph": False},
                  "a0.h0->m0": {"score": 2.0, "in_graph": True},
                  "m0->logits": {"score": -3.0, "in_graph": True},
                  "input->logits": {"score": 0.0, "in_graph": False}}}
    df, on = from_mib_json(their)
    assert df.values.tolist() == [["m0", "reward", "", -3.0], ["a0.h0", "m0", "", 2.0],
                                  ["input", "a0.h1", "k", -0.5], ["input", "a0.h0", "q", 0.25],
                                  ["input", "a0.h0", "k", 0.125], ["input", "reward", "", 0.0]]
    assert on == {("input", "a0.h0", "q"), ("a0.h0", "m0", ""), ("m0", "reward", "")}
    grouped, on = from_mib_json(their, n_kv_heads=1)  # both heads' keys: one key/value head
    assert grouped.loc[grouped.qkv == "k"].values.tolist() == [["input", "a0.h0", "k", -0.375]]
    assert ("input", "a0.h0", "k") not in on


def test_edges_outside_their_graph_are_named(tmp_path: Path) -> None:
    def one(src: str, dst: str, qkv: str) -> pd.DataFrame:
        return pd.DataFrame({"src": [src], "dst": [dst], "qkv": [qkv], "score": [1.0]})

    with pytest.raises(TLRewardError, match="SAE feature nodes"):
        to_mib_json(one("f1.3", "reward", ""), L, H, d_model=D)
    with pytest.raises(TLRewardError, match="not an edge"):
        to_mib_json(one("a1.h0", "a1.h2", "q"), L, H, d_model=D)  # same layer
    with pytest.raises(TLRewardError, match="not an edge"):
        to_mib_json(one("a1.h0", "m1", ""), L, H, d_model=D, parallel_attn_mlp=True)
    with pytest.raises(TLRewardError, match="d_model"):
        to_mib_json(one("input", "m0", ""), L, H)
    with pytest.raises(TLRewardError, match="is not 'src->dst'"):
        from_mib_json({"cfg": {"n_layers": 1, "n_heads": 1}, "edges": {"x=>m0": {"score": 1}}})
    (tmp_path / "bad.json").write_text(json.dumps({"edges": {}}))
    with pytest.raises(TLRewardError, match="needs 'cfg' and 'edges'"):
        from_mib_json(tmp_path / "bad.json")
