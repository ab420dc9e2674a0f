"""Reward circuits: the edge graph of a reward model, edge attribution (exact, EAP, EAP-IG) and
circuits with their faithfulness (methods section 10)."""

from tl_reward.circuits.circuit import (
    MIB_SIZES,
    CircuitEvaluation,
    FaithfulnessCurve,
    RewardCircuit,
    edge_stability,
    evaluate_circuit,
    faithfulness_curve,
    heldout_faithfulness,
    prune,
)
from tl_reward.circuits.edges import EdgeAttribution, FeatureEdges, edge_attribution
from tl_reward.circuits.graph import RewardGraph

__all__ = ["MIB_SIZES", "CircuitEvaluation", "EdgeAttribution", "FaithfulnessCurve",
           "FeatureEdges", "RewardCircuit", "RewardGraph", "edge_attribution", "edge_stability",
           "evaluate_circuit", "faithfulness_curve", "heldout_faithfulness", "prune"]
