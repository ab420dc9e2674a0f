"""``tl-reward circuit`` on a tiny saved model: its scores, circuit and MIB file equal the
library's functions called in this process; the page is offline; bad options are named."""

from __future__ import annotations

import json
import re
import warnings

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


def drawn_edges(page: str) -> set[tuple[str, str, str]]:
    """The ``(src, dst, qkv)`` of every edge the view draws (each edge's hover title)."""
    return {(a, b, q or "") for a, b, q in re.findall(
        r'<path class="e"[^>]*><title>(\S+) \u2192 (\S+)(?: \(([qkv])\))?: score', page)}


def test_circuit_command_equals_the_library(tmp_path, capsys):
    """Defaults: a greedy circuit of --edges connected edges; the page draws exactly that
    circuit, and its title names the method, the rule and the circuit's faithfulness."""
    rm = save_tiny_reward_model(tmp_path / "rm", "llama", seed=0)
    src = tmp_path / "pairs.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in LINES))
    out, mib = tmp_path / "c.html", tmp_path / "c.json"
    assert main(["circuit", "--model", str(rm), "--input", str(src), "--device", "cpu",
                 "--ig-steps", "2", "--edges", "12", "--output", str(out),
                 "--mib-json", str(mib)]) == 0
    printed = capsys.readouterr().out
    model = HookedRewardModel.from_pretrained(str(rm), device="cpu")
    pairs = read_pairs(src)
    want = edge_attribution(model, pairs, ig_steps=2, ablation="mean")
    circuit = RewardCircuit.greedy(want, 12)
    assert circuit.n_edges >= 12
    ev = evaluate_circuit(model, circuit, pairs, ablation="mean")
    assert f"circuit of {circuit.n_edges} edges" in printed
    assert f"faithfulness {ev.faithfulness}" in printed
    table, in_graph = from_mib_json(mib, n_kv_heads=want.graph.n_kv_heads)
    got = table.set_index(["src", "dst", "qkv"])["score"]
    ref = want.to_dataframe().set_index(["src", "dst", "qkv"])["score"]
    assert got.loc[ref.index].to_numpy() == pytest.approx(ref.to_numpy(), rel=1e-12, abs=1e-15)
    assert in_graph == set(circuit.edges())
    assert json.loads(mib.read_text())["cfg"]["scoring"] == want.label
    page = out.read_text()
    assert not re.search(r"""(src|href)=["']https?:""", page)
    assert drawn_edges(page) == set(circuit.edges())
    assert (f"{want.label} on 3 pairs (ablation mean); {circuit.n_edges} edges (grown "
            f"greedily from the reward) keep {ev.faithfulness.value:.2f} of the margin") in page


def test_circuit_command_top_selection_and_the_bridge(tmp_path, capsys):
    """``--select top`` draws the pruned top edges; ``--backend bridge`` runs the same command
    on the bridge, to the hooked model's numbers."""
    from tl_reward.model.bridge_reward_model import BridgeRewardModel

    rm = save_tiny_reward_model(tmp_path / "rm", "llama", seed=0)
    src, out = tmp_path / "pairs.jsonl", tmp_path / "c.html"
    src.write_text("\n".join(json.dumps(x) for x in LINES))
    args = ["circuit", "--model", str(rm), "--input", str(src), "--device", "cpu",
            "--method", "eap", "--edges", "12", "--output", str(out)]
    assert main([*args, "--select", "top"]) == 0
    model = HookedRewardModel.from_pretrained(str(rm), device="cpu")
    pairs = read_pairs(src)
    want = edge_attribution(model, pairs, method="eap", ablation="mean")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pruning may keep fewer than 12
        assert drawn_edges(out.read_text()) == set(RewardCircuit.top(want, 12).edges())
    capsys.readouterr()
    assert main([*args, "--backend", "bridge"]) == 0
    printed = capsys.readouterr().out
    bridge = BridgeRewardModel.from_pretrained(str(rm), device="cpu")
    got = edge_attribution(bridge, pairs, method="eap", ablation="mean")
    circuit = RewardCircuit.greedy(got, 12)
    assert set(circuit.edges()) == set(RewardCircuit.greedy(want, 12).edges())
    ev = evaluate_circuit(bridge, circuit, pairs, ablation="mean")
    assert f"faithfulness {ev.faithfulness}" in printed
    assert drawn_edges(out.read_text()) == set(circuit.edges())


def test_circuit_command_names_bad_options(tmp_path, capsys):
    rm = save_tiny_reward_model(tmp_path / "rm", "llama", seed=0)
    src = tmp_path / "pairs.jsonl"
    src.write_text(json.dumps(LINES[0]))
    assert main(["circuit", "--model", str(rm), "--input", str(src), "--device", "cpu",
                 "--top", "0"]) == 1
    assert "--edges (--top) must be at least 1" in capsys.readouterr().err
    assert main(["circuit", "--model", str(rm), "--input", str(src), "--device", "cpu",
                 "--method", "eap-ig", "--ig-rule", "trapezoid"]) == 1
    assert "ig_rule must be one of ('left', 'right', 'midpoint')" in capsys.readouterr().err


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
            "--method", "eap", "--top", "12", "--select", "top", "--sae", str(tmp_path / "sae")]
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
