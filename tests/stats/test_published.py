"""The published reward-lens v1.0.0 definitions live in one compatibility module, each named
with the flaw it reproduces; the probe report shows the same published d (one definition)."""

from __future__ import annotations

import tl_reward.audit.probes as probes
import tl_reward.compat.published as published

FUNCTIONS = ["published_cohens_d", "published_probe_texts", "run_published_probes",
             "published_distortion_index", "published_cascade", "published_conflict",
             "published_verdict", "published_concept_alignment"]


def test_every_published_function_is_documented_with_its_flaw() -> None:
    funcs = [n for n in dir(published) if n.startswith(("published_", "run_published_"))]
    assert sorted(funcs) == sorted(FUNCTIONS)
    for name in funcs:
        assert f"``{name}``" in published.__doc__, name  # the module's list names its flaw
        assert getattr(published, name).__doc__
    assert published.published_cohens_d([0.3]) == float("inf")  # its flaw, reproduced
    assert probes.published_cohens_d is published.published_cohens_d
