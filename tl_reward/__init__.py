"""tl_reward: mechanistic interpretability for reward models, on TransformerLens.

>>> from tl_reward import HookedRewardModel
>>> model = HookedRewardModel.from_pretrained("tl-reward/smollm2-135m-hh")
"""

import functools
import hashlib
from pathlib import Path

from tl_reward._lazy import lazy_exports

__version__ = "0.1.0"


def _source_digest(root: Path) -> str:
    """16 hex digits of SHA-256 over every ``*.py`` file under ``root`` (path and bytes)."""
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(f"{f.relative_to(root).as_posix()}\0{f.stat().st_size}\0".encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


@functools.cache
def library_version() -> str:
    """``__version__`` plus a digest of the library's source (computed once per process): what
    run identities record, so a store made by other code is never resumed."""
    return f"{__version__}+{_source_digest(Path(__file__).parent)}"


_EXPORTS = {
    "DEMO_MODEL_NAME": "tl_reward.model.demo",
    "Architecture": "tl_reward.architectures",
    "HookedRewardModel": "tl_reward.model.hooked_reward_model",
    "BridgeRewardModel": "tl_reward.model.bridge_reward_model",
    "Message": "tl_reward.data.conversation",
    "PreferencePair": "tl_reward.data.preference",
    "RewardResult": "tl_reward.model.scoring",
    "load_hh_rlhf": "tl_reward.data.hh_rlhf",
    "load_result": "tl_reward.results",
    "register_architecture": "tl_reward.architectures",
    "score_pairs": "tl_reward.model.scoring",
    "supported_architectures": "tl_reward.architectures",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
