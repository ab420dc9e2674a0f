"""The run identity and the chunked store: a reopened folder with another identity is refused
naming every differing field; function digests see a changed body, closure or helper."""

from __future__ import annotations

import functools
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tl_reward.errors import TLRewardError
from tl_reward.store import (
    ChunkStore,
    RunIdentity,
    StoreMismatchError,
    entry_key,
    function_digest,
)

IDENT = RunIdentity("probes", "org/rm", "f" * 32, "t" * 32, "c" * 64, "i" * 64,
                    {"edit": "e" * 64}, {"seed": 0}, "0.1.0")


def test_store_resumes_the_same_identity_and_refuses_another(tmp_path: Path) -> None:
    folder = tmp_path / IDENT.folder_name()
    store = ChunkStore(folder, IDENT)
    store.save("a.txt", lambda p: p.write_text("one"))
    assert store.has("a.txt") and not store.has("b.txt")
    assert sorted(p.name for p in folder.iterdir()) == ["a.txt", "manifest.json"]  # no .tmp
    again = ChunkStore(folder, RunIdentity.from_json(IDENT.to_json()))  # round trip: equal
    assert again.path("a.txt").read_text() == "one"
    other = replace(IDENT, model_fingerprint="0" * 32, chat_template="1" * 64,
                    functions={"edit": "2" * 64}, model_name="renamed")
    with pytest.raises(StoreMismatchError) as err:
        ChunkStore(folder, other)
    msg = str(err.value)
    assert isinstance(err.value, TLRewardError)
    listed = msg.split("other settings (")[1].split(" differ")[0].split(", ")
    # exactly what differs (the model's name only names the folder)
    assert listed == ["model_fingerprint", "chat_template", "functions.edit"]
    assert "overwrite=True" in msg
    fresh = ChunkStore(folder, other, overwrite=True)
    assert not fresh.has("a.txt")
    assert RunIdentity.from_json((folder / "manifest.json").read_text()) == other


def test_a_foreign_manifest_is_refused(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(StoreMismatchError, match="model_fingerprint"):
        ChunkStore(tmp_path, IDENT)


def test_digest_sees_every_element_of_an_array() -> None:
    import numpy as np

    from tl_reward.store import digest

    a = np.zeros(5000, dtype=np.int64)
    b = a.copy()
    b[2500] = 1  # str(array) would abridge both to the same "[0 0 0 ... 0 0 0]"
    assert str(a) == str(b) and digest([a]) != digest([b])
    assert digest([a]) == digest([a.tolist()])


def test_with_job_and_folder_name() -> None:
    a = IDENT.with_job(["x", "y"], settings={"seed": 1})
    assert a.inputs == IDENT.with_job(["x", "y"]).inputs != IDENT.with_job(["y", "x"]).inputs
    assert a.folder_name().startswith("probes-org_rm-")
    assert a.folder_name() != IDENT.with_job(["x", "y"], settings={"seed": 2}).folder_name()
    assert a.folder_name() == replace(a, model_fingerprint="0").folder_name()
    assert a.differences(replace(a, settings={"seed": 2})) == ["settings.seed"]


def _helper(x: str) -> str:
    return x + "!"


def _calls_helper(x: str) -> str:
    return _helper(x)


def test_function_digest_sees_code_closures_and_helpers(monkeypatch: pytest.MonkeyPatch) -> None:
    def f(x: str) -> str:
        return x.upper()

    d1 = function_digest(f)
    assert function_digest(f) == d1

    def f(x: str) -> str:  # noqa: F811 - same name, other code
        return x.lower()

    assert function_digest(f) != d1

    def wrap(fn):  # noqa: ANN001, ANN202
        def edit(x: str) -> str:
            return fn(x)
        return edit

    assert function_digest(wrap(str.upper)) != function_digest(wrap(str.lower))
    assert function_digest(wrap(_helper)) == function_digest(wrap(_helper))
    p = functools.partial(_helper)
    assert function_digest(p) != function_digest(_helper)
    before = function_digest(_calls_helper)

    def other(x: str) -> str:  # the helper called by name changes
        return x + "?"

    monkeypatch.setattr(sys.modules[__name__], "_helper", other)
    assert function_digest(_calls_helper) != before


WORDS = ("a", "b")


def _reads_words(x: str) -> str:
    return x + WORDS[0]


def _calls_reader(x: str) -> str:
    return "".join(_reads_words(c) for c in x)  # called from a comprehension's own code


def test_function_digest_hashes_globals_and_values_by_value(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """Issue 28: module constants an edit reads, and closure values that are not JSON (sets,
    arrays, tensors), were hashed by type name only, so a change kept the digest."""
    import numpy as np
    import torch

    before = function_digest(_calls_reader)
    monkeypatch.setattr(sys.modules[__name__], "WORDS", ("c", "b"))  # a helper's global
    assert function_digest(_calls_reader) != before
    monkeypatch.setattr(sys.modules[__name__], "WORDS", ("a", "b"))
    assert function_digest(_calls_reader) == before

    def wrap(value):  # noqa: ANN001, ANN202
        def edit(x: str) -> str:
            return x + str(value)
        return edit

    same_and_other = [({"x", "y"}, {"y", "x"}, {"x", "z"}),
                      (frozenset({1}), frozenset([1]), frozenset({2})),
                      (np.arange(3), np.arange(3), np.arange(1, 4)),
                      (np.arange(3), np.arange(3), np.arange(3.0)),  # the dtype counts
                      (torch.zeros(2), torch.zeros(2), torch.tensor([0.0, 1e-30])),
                      ((1, {"a"}), (1, {"a"}), (1, {"b"})),
                      ({"k": {1, 2}}, {"k": {2, 1}}, {"k": {1, 3}})]
    for a, same, other in same_and_other:
        assert function_digest(wrap(a)) == function_digest(wrap(same)), a
        assert function_digest(wrap(a)) != function_digest(wrap(other)), (a, other)


def test_function_digest_follows_helpers_of_the_users_own_package(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An edit calling a helper of another module of its own package: no library version covers
    that module, so the helper (and the constants it reads) is followed; it was skipped."""
    (tmp_path / "i28pkg").mkdir()
    (tmp_path / "i28pkg" / "__init__.py").write_text("")
    (tmp_path / "i28pkg" / "util.py").write_text(
        "WORDS = ('a',)\n\n\ndef helper(x):\n    return x + WORDS[0]\n")
    (tmp_path / "i28pkg" / "edits.py").write_text(
        "from i28pkg.util import helper\n\n\ndef edit(x):\n    return helper(x)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from i28pkg import edits, util  # type: ignore[import-not-found]

    before = function_digest(edits.edit)
    monkeypatch.setattr(util, "WORDS", ("b",))
    assert function_digest(edits.edit) != before


def test_the_library_version_changes_with_the_code(tmp_path: Path) -> None:
    """Issue 28: ``__version__`` stayed 0.1.0 over 190 commits, so a store made by other code
    resumed. The identity's ``library`` now carries a digest of the library's source."""
    import tl_reward
    from tl_reward import _source_digest, library_version

    pkg = Path(tl_reward.__file__).parent
    assert library_version() == f"{tl_reward.__version__}+{_source_digest(pkg)}"
    for rel in ("tl_reward/__init__.py", "tl_reward/a/b.py", "tl_reward/a/data.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    root = tmp_path / "tl_reward"
    d = _source_digest(root)
    (root / "a" / "data.txt").write_text("not code")
    assert _source_digest(root) == d
    (root / "a" / "b.py").write_text("x = 2\n")
    assert _source_digest(root) != d
    (root / "a" / "b.py").rename(root / "a" / "c.py")
    assert len({d, _source_digest(root)}) == 2
    stored = tmp_path / "run"
    ChunkStore(stored, replace(IDENT, library=tl_reward.__version__))  # made by other code
    with pytest.raises(StoreMismatchError, match="library"):
        ChunkStore(stored, replace(IDENT, library=library_version()))


def test_a_run_with_attachments_never_resumes(tmp_path: Path) -> None:
    """A model with hooks or replaced modules: its run is recorded with them and refused on
    resume, with or without them now (two hooks may share a description, not their code)."""
    hooked = replace(IDENT, attachments=["a hook on blocks.0.mlp"])
    ChunkStore(tmp_path / "a", hooked)
    for now in (IDENT, hooked):
        with pytest.raises(StoreMismatchError, match=r"a hook on blocks\.0\.mlp") as err:
            ChunkStore(tmp_path / "a", now)
        assert "Remove them" in str(err.value) and "overwrite=True" in str(err.value)
    ChunkStore(tmp_path / "b", IDENT)
    with pytest.raises(StoreMismatchError, match="blocks.0.mlp"):
        ChunkStore(tmp_path / "b", hooked)
    with pytest.raises(StoreMismatchError, match="blocks.0.mlp"):  # nor is one cached
        entry_key(hooked, [1, 2])
    assert ChunkStore(tmp_path / "a", hooked, overwrite=True).has("manifest.json")


def test_attachments_are_read_off_the_model(tiny) -> None:  # noqa: ANN001
    import torch

    model = tiny("qwen2")[0]
    assert RunIdentity.of_model("x", model).attachments == []
    handle = model.blocks[0].mlp.register_forward_hook(lambda m, i, o: o * 0)
    try:
        found = RunIdentity.of_model("x", model).attachments
    finally:
        handle.remove()
    assert found == ["a hook on blocks.0.mlp"]
    model.add_hook("blocks.1.hook_resid_post", lambda t, hook: t)
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
    try:
        found = RunIdentity.of_model("x", model).attachments
    finally:
        model.reset_hooks()
        handle.remove()
    assert any("blocks.1.hook_resid_post" in a for a in found) and any("global" in a for a in found)
    assert RunIdentity.of_model("x", model).attachments == []


def test_entry_cache_keys_cover_the_identity(tmp_path: Path) -> None:
    from tl_reward.store import EntryCache

    key = entry_key(IDENT, [1, 2, 3])
    assert key == entry_key(replace(IDENT, model_name="a copy"), [1, 2, 3])  # name: no part
    for change in ({"model_fingerprint": "0"}, {"tokenizer": "0"}, {"library": "9"},
                   {"settings": {"seed": 1}}, {"functions": {}}):
        assert entry_key(replace(IDENT, **change), [1, 2, 3]) != key
    assert entry_key(IDENT, [1, 2, 4]) != key
    cache = EntryCache(tmp_path / "c")
    assert cache.get(key) is None
    cache.put(key, {"delta": 0.5})
    assert cache.get(key) == {"delta": 0.5}
    assert [p.name for p in (tmp_path / "c").iterdir()] == [f"{key}.json"]
