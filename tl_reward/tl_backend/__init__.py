"""Everything that touches TransformerLens internals lives in this package, so a
TransformerBridge backend can replace it as a whole.

* :mod:`.weights`: ``HookedTransformerConfig`` objects, TransformerLens's weight converters with
  the reward head standing in for ``lm_head``, weight processing a block at a time;
* :mod:`.prefix_cache`: key/value caches of a prompt prefix (used by patching and the sweep);
* :mod:`.continuation`: the forward pass of new positions after a cached prefix;
* :mod:`.bridge`: reward models on ``TransformerBridge``.

The names below are imported on first use: ``weights`` and ``continuation`` need
``HookedTransformer``, which TransformerLens 4 removed, and the bridge must import without them.
"""

from tl_reward._lazy import lazy_exports

_EXPORTS = {
    "final_residual_at": "tl_reward.tl_backend.continuation",
    "run_after_prefix": "tl_reward.tl_backend.continuation",
    "FusedQKV": "tl_reward.tl_backend.prefix_cache",
    "PrefixCache": "tl_reward.tl_backend.prefix_cache",
    "attachments": "tl_reward.model.fingerprint",
    "build_prefix_cache": "tl_reward.tl_backend.prefix_cache",
    "cache_keys": "tl_reward.tl_backend.prefix_cache",
    "continuation_method": "tl_reward.tl_backend.prefix_cache",
    "expand_stock_cache": "tl_reward.tl_backend.prefix_cache",
    "fast_cache_unsupported": "tl_reward.tl_backend.prefix_cache",
    "frozen_kv_cache": "tl_reward.tl_backend.prefix_cache",
    "fuse_qkv": "tl_reward.tl_backend.prefix_cache",
    "hooks_active": "tl_reward.tl_backend.prefix_cache",
    "is_bridge": "tl_reward.tl_backend.bridge",
    "nonstock_module": "tl_reward.tl_backend.prefix_cache",
    "require_hooked": "tl_reward.tl_backend.bridge",
    "sae_bridge": "tl_reward.tl_backend.bridge",
    "PROCESSING": "tl_reward.tl_backend.weights",
    "convert_state_dict": "tl_reward.tl_backend.weights",
    "cpu_config": "tl_reward.tl_backend.weights",
    "make_config": "tl_reward.tl_backend.weights",
    "process_weights": "tl_reward.tl_backend.weights",
    "process_weights_stock": "tl_reward.tl_backend.weights",
    "tl_converter": "tl_reward.tl_backend.weights",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
