"""Inputs: conversations, preference pairs and dataset loaders."""

from tl_reward.data.conversation import Conversation, Message, as_conversation
from tl_reward.data.hh_rlhf import LoadReport, load_hh_rlhf, parse_dialogue
from tl_reward.data.pairs import PairBatch, TokenizedPair, tokenize_pair, tokenize_pairs
from tl_reward.data.preference import PreferencePair

__all__ = [
    "Conversation",
    "LoadReport",
    "PairBatch",
    "Message",
    "PreferencePair",
    "TokenizedPair",
    "as_conversation",
    "load_hh_rlhf",
    "parse_dialogue",
    "tokenize_pair",
    "tokenize_pairs",
]
