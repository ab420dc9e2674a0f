"""``tl-reward circuit`` on a tiny saved model: its scores, circuit and MIB file equal the
library's functions called in this process; the page is offline; bad options are named."""

from __future__ import annotations

import json
import re

import pytest

from tl_reward import HookedRewardModel
from tl_reward.circuits import RewardCircuit, edge_attribution, evaluate_circuit
from tl_reward.circuits.mib import from_mib_json
from tl_reward.cli import main
from tl_reward.cli.common import read_pairs
from tl_reward.testing import save_tiny_reward_model

LINES = [{"prompt": "Is the sky blue?", "chosen": "Yes, on a clear day.", "rejected": "No."},
         {"prompt": "What is love?", "chosen": "Love. Friendship.", "rejected": "Hate. War."},
         {"prompt": "Be kind.", "chosen": "Thanks for asking.", "rejected": "Sure!"}]


def test_circuit_command_equals_the_library(tmp_path, capsys):
    rm = save_tiny_reward_model(tmp_path / "rm", "llama", seed=0)
    src = tmp_path / "pairs.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in LINES))
    out, mib = tmp_path / "c.html", tmp_path / "c.json"
    assert main(["circuit", "--model", str(rm), "--input", str(src), "--device", "cpu",
                 "--method", "eap", "--top", "12", "--output", str(out),
                 "--mib-json", str(mib)]) == 0
    printed = capsys.readouterr().out
    model = HookedRewardModel.from_pretrained(str(rm), device="cpu")
    pairs = read_pairs(src)
    want = edge_attribution(model, pairs, method="eap", ablation="mean")
    circuit = RewardCircuit.top(want, 12)
    ev = evaluate_circuit(model, circuit, pairs, ablation="mean")
    assert f"faithfulness {ev.faithfulness}" in printed
    table, in_graph = from_mib_json(mib, n_kv_heads=want.graph.n_kv_heads)
    got = table.set_index(["src", "dst", "qkv"])["score"]
    ref = want.to_dataframe().set_index(["src", "dst", "qkv"])["score"]
    assert got.loc[ref.index].to_numpy() == pytest.approx(ref.to_numpy(), rel=1e-12, abs=1e-15)
    assert in_graph == set(circuit.edges())
    page = out.read_text()
    assert not re.search(r"""(src|href)=["']https?:""", page)
    top = want.to_dataframe().iloc[0]
    assert top.src in page and "eap on 3 pairs (ablation mean)" in page


def test_circuit_command_names_bad_options(tmp_path, capsys):
    rm = save_tiny_reward_model(tmp_path / "rm", "llama", seed=0)
    src = tmp_path / "pairs.jsonl"
    src.write_text(json.dumps(LINES[0]))
    assert main(["circuit", "--model", str(rm), "--input", str(src), "--device", "cpu",
                 "--top", "0"]) == 1
    assert "--top must be at least 1" in capsys.readouterr().err


def test_circuit_command_with_an_sae_equals_the_library(tmp_path, capsys):
    """``--sae``: the SAE's features and error term are nodes of the scored circuit and the
    view; ``--mib-json`` with it is refused (their graph has no feature nodes)."""
    from tests.circuits.test_sae_nodes import make_sae
    from tl_reward.sae import load_sae

    rm = save_tiny_reward_model(tmp_path / "rm", "llama", seed=0)
    model = HookedRewardModel.from_pretrained(str(rm), device="cpu")
    make_sae(model.cfg.d_model, "blocks.1.hook_mlp_out").save_model(tmp_path / "sae")
    src, out = tmp_path / "pairs.jsonl", tmp_path / "c.html"
    src.write_text("\n".join(json.dumps(x) for x in LINES))
    args = ["circuit", "--model", str(rm), "--input", str(src), "--device", "cpu",
            "--method", "eap", "--top", "12", "--sae", str(tmp_path / "sae")]
    assert main([*args, "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    sae = load_sae(model, str(tmp_path / "sae"))
    want = edge_attribution(model, read_pairs(src), method="eap", ablation="mean", sae=sae)
    circuit = RewardCircuit.top(want, 12)
    assert any(e[0].startswith("m1.") for e in circuit.edges())
    ev = evaluate_circuit(model, circuit, read_pairs(src), ablation="mean", sae=sae)
    assert f"faithfulness {ev.faithfulness}" in printed
    assert 'data-name="m1.err"' in out.read_text()
    assert main([*args, "--mib-json", str(tmp_path / "g.json")]) == 1
    assert "no SAE feature nodes" in capsys.readouterr().err
