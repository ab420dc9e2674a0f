"""Inputs: conversations, preference pairs and dataset loaders."""

from tl_reward._lazy import lazy_exports

_EXPORTS = {
    "Conversation": "tl_reward.data.conversation",
    "LoadReport": "tl_reward.data.hh_rlhf",
    "Message": "tl_reward.data.conversation",
    "PairBatch": "tl_reward.data.pairs",
    "PreferencePair": "tl_reward.data.preference",
    "TokenizedPair": "tl_reward.data.pairs",
    "as_conversation": "tl_reward.data.conversation",
    "load_hh_rlhf": "tl_reward.data.hh_rlhf",
    "parse_dialogue": "tl_reward.data.hh_rlhf",
    "short_pairs": "tl_reward.data.pairs",
    "tokenize_pair": "tl_reward.data.pairs",
    "tokenize_pairs": "tl_reward.data.pairs",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
