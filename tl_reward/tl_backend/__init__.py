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
    **dict.fromkeys(["final_residual_at", "run_after_prefix"], "tl_reward.tl_backend.continuation"),
    **dict.fromkeys(["FusedQKV", "PrefixCache", "attachments", "build_prefix_cache", "cache_keys",
                     "continuation_method", "expand_stock_cache", "fast_cache_unsupported",
                     "frozen_kv_cache", "fuse_qkv", "hooks_active", "nonstock_module"],
                    "tl_reward.tl_backend.prefix_cache"),
    **dict.fromkeys(["PROCESSING", "convert_state_dict", "cpu_config", "make_config",
                     "process_weights", "process_weights_stock", "tl_converter"],
                    "tl_reward.tl_backend.weights"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
