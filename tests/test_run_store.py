"""The run identity and the chunked store: a reopened folder with another identity is refused
naming every differing field; function digests see a changed body, closure or helper."""

from __future__ import annotations

import functools
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tl_reward.errors import TLRewardError
from tl_reward.store import ChunkStore, RunIdentity, StoreMismatchError, function_digest

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


def test_entry_cache_keys_cover_the_identity(tmp_path: Path) -> None:
    from tl_reward.store import EntryCache, entry_key

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
