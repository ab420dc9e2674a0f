"""Block-at-a-time weight processing equals TransformerLens's own processing, bit for bit."""

from __future__ import annotations

import pytest
import torch

from tl_reward import HookedRewardModel
from tl_reward.testing import tiny_hf_reward_model
from tl_reward.testing.tiny import ARCHITECTURES
from tl_reward.tl_backend import process_weights, process_weights_stock


def _load(arch: str, dtype: torch.dtype, processing: object,
          monkeypatch: pytest.MonkeyPatch) -> HookedRewardModel:
    hf, tok = tiny_hf_reward_model(arch, 3 if arch == "armorm" else 1)
    monkeypatch.setattr("tl_reward.tl_backend.process_weights", processing)
    model = HookedRewardModel.from_pretrained(hf_model=hf, tokenizer=tok, device="cpu",
                                              dtype=dtype)
    monkeypatch.undo()
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_blockwise_processing_equals_stock(arch: str, dtype: torch.dtype,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    ours = _load(arch, dtype, process_weights, monkeypatch)
    stock = _load(arch, dtype, process_weights_stock, monkeypatch)
    a, b = ours.state_dict(), stock.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert torch.equal(a[key], b[key]), key
    assert ours.cfg.normalization_type == stock.cfg.normalization_type
    assert ([type(m).__name__ for m in ours.modules()]
            == [type(m).__name__ for m in stock.modules()])
