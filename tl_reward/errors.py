"""Errors raised by tl_reward. Each message names the problem and the fix."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any


class TLRewardError(ValueError):
    """Base class for tl_reward's input and configuration errors."""


def check_choice(value: Any, choices: Collection[Any], what: str) -> None:
    """Refuse ``value`` unless it is one of ``choices`` (``what`` names it in the error)."""
    if value not in choices:
        raise TLRewardError(f"unknown {what} {value!r}; {what} must be one of {tuple(choices)}")


def check_range(name: str, value: float, lo: float, hi: float, closed: bool = False) -> None:
    """Raise :class:`TLRewardError` unless ``lo <= value < hi`` (``<= hi`` if ``closed``)."""
    if not (lo <= value <= hi if closed else lo <= value < hi):
        raise TLRewardError(f"{name} must lie in [{lo}, {hi}{']' if closed else ')'}, got {value}")


class UnsupportedArchitectureError(TLRewardError):
    """The HF architecture has no registered converter."""


class MissingPadTokenError(TLRewardError):
    """A batch of several sequences needs a pad token the model does not define."""


class AmbiguousPaddingError(TLRewardError):
    """Padding cannot be inferred from the tokens (the pad id is also the BOS): pass a mask."""


class ContextLengthError(TLRewardError):
    """An input is longer than the model's context window."""


class TokenizerMismatchError(TLRewardError):
    """The tokenizer's vocabulary does not fit the model's embedding."""


class EmptyResponseError(TLRewardError):
    """A response to be scored is empty. :attr:`problem` is the message without its ``fix``,
    for a caller that knows a better fix (the command line names the file's line)."""

    def __init__(self, problem: str, fix: str = "") -> None:
        super().__init__(f"{problem} ({fix})" if fix else problem)
        self.problem = problem


class UnknownObjectiveError(TLRewardError, KeyError):
    """An objective name or index that the reward head does not have."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class MissingTokenizerError(TLRewardError):
    """Text or a conversation was given to a model loaded without a tokenizer."""


class SAEError(TLRewardError):
    """An SAE that does not fit the model, or a request the SAE analyses cannot serve."""


class StoreMismatchError(TLRewardError):
    """A resumable job's folder holds results of a run with another run identity."""


class SAELensUnavailableError(ImportError):
    """SAELens cannot be imported: not installed, or under TransformerLens 4 (SAELens#738)."""


def require_sae_lens() -> None:
    """Import SAELens, or raise :class:`SAELensUnavailableError` saying why the SAE parts
    cannot run here."""
    try:
        import sae_lens  # noqa: F401
    except ImportError as e:
        raise SAELensUnavailableError(
            f"the SAE parts of tl_reward need SAELens, which cannot be imported here ({e}). "
            "SAELens 6 pins transformer-lens<4 and does not import under TransformerLens 4 "
            "(SAELens#738): use the default install (transformer-lens 3.9) for SAEs; "
            "BridgeRewardModel works without it") from e


class ResultFileError(TLRewardError):
    """A saved result file (or stored chunk) that cannot be read: not a result, damaged,
    malformed, holding pickled objects (possibly tampered with), or naming a type that is not a
    registered tl_reward result."""


def check_tokens(ids: Sequence[int], who: str, n_ctx: int | None = None,
                 d_vocab: int | None = None) -> None:
    """Refuse a row the model cannot read: no tokens, more than ``n_ctx``, or an id outside
    ``d_vocab``; ``who`` names it as the user gave it (``input 3``, ``pair 2 (rejected
    reply)``, ``data.jsonl:7``)."""
    if not ids:
        raise EmptyResponseError(f"{who} has no tokens")
    if n_ctx is not None and len(ids) > n_ctx:
        raise ContextLengthError(
            f"{who} has {len(ids)} tokens, more than the model's context of {n_ctx}; "
            "shorten it (e.g. drop early turns of the conversation)"
        )
    if d_vocab is not None and (max(ids) >= d_vocab or min(ids) < 0):
        raise TokenizerMismatchError(
            f"{who} has token id {max(ids)} but the model's vocabulary has "
            f"{d_vocab} entries; the tokenizer does not match this model (load the "
            "tokenizer saved with the reward model)"
        )
