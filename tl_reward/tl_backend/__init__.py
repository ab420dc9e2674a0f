"""Everything that touches TransformerLens internals lives in this package, so a
TransformerBridge backend can replace it as a whole.

* :mod:`.weights`: ``HookedTransformerConfig`` objects, TransformerLens's weight converters with
  the reward head standing in for ``lm_head``, weight processing a block at a time;
* :mod:`.prefix_cache`: key/value caches of a prompt prefix (used by patching and the sweep);
* :mod:`.continuation`: the forward pass of new positions after a cached prefix.
"""

from tl_reward.tl_backend.continuation import final_residual_at, run_after_prefix
from tl_reward.tl_backend.prefix_cache import (
    FusedQKV,
    PrefixCache,
    attachments,
    build_prefix_cache,
    cache_keys,
    continuation_method,
    expand_stock_cache,
    fast_cache_unsupported,
    frozen_kv_cache,
    fuse_qkv,
    hooks_active,
    nonstock_module,
)
from tl_reward.tl_backend.weights import (
    PROCESSING,
    convert_state_dict,
    cpu_config,
    make_config,
    process_weights,
    process_weights_stock,
    tl_converter,
)

__all__ = [
    "PROCESSING", "FusedQKV", "PrefixCache", "attachments", "build_prefix_cache", "cache_keys",
    "continuation_method", "nonstock_module",
    "convert_state_dict", "cpu_config", "expand_stock_cache", "fast_cache_unsupported",
    "final_residual_at", "frozen_kv_cache", "fuse_qkv", "hooks_active", "make_config",
    "process_weights", "process_weights_stock", "run_after_prefix", "tl_converter",
]
