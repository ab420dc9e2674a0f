"""The published reward-lens v1.0.0 definitions live in one compatibility module; every old
import path resolves to the same object, and each function names the flaw it reproduces."""

from __future__ import annotations

import importlib

import pytest

import tl_reward.compat.published as published

OLD_PATHS = {
    "tl_reward.stats.paired": ["published_cohens_d"],
    "tl_reward.audit.distortion": ["PublishedDistortion", "published_distortion_index"],
    "tl_reward.audit.cascade": ["PublishedCascade", "published_cascade"],
    "tl_reward.audit.conflict": ["PublishedConflict", "published_conflict", "published_verdict"],
    "tl_reward.audit.concepts": ["PublishedConceptAlignment", "published_concept_alignment"],
    "tl_reward.audit.perturbations": ["PublishedProbe", "published_probe_texts"],
    "tl_reward.audit.probes": ["PublishedProbeReport", "published_probes",
                               "run_published_probes"],
}


@pytest.mark.parametrize("module", sorted(OLD_PATHS))
def test_old_import_paths_resolve_to_the_compat_module(module: str) -> None:
    mod = importlib.import_module(module)
    for name in OLD_PATHS[module]:
        assert getattr(mod, name) is getattr(published, name)
        assert getattr(published, name).__module__ == "tl_reward.compat.published"
    with pytest.raises(AttributeError):
        mod.no_such_name  # noqa: B018 - the lazy lookup still refuses unknown names


def test_every_published_function_is_documented_with_its_flaw() -> None:
    funcs = [n for n in dir(published) if n.startswith(("published_", "run_published_"))]
    assert sorted(funcs) == sorted(n for names in OLD_PATHS.values() for n in names
                                   if not n[0].isupper())
    for name in funcs:
        assert name in published.__doc__, name  # the module's table names it
        assert getattr(published, name).__doc__
    assert published.published_cohens_d([0.3]) == float("inf")  # its flaw, reproduced
