"""Every result saves and loads the same way: ``result.save(path)``, ``Type.load(path)`` and
``tl_reward.load_result(path)`` give back every field with its type, dtype and shape."""

from __future__ import annotations

import dataclasses
import importlib
import io
import json
import math
import pkgutil
import subprocess
import sys
import typing
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import PicklePayload

import tl_reward
from tl_reward import load_result
from tl_reward.errors import ResultFileError, TLRewardError
from tl_reward.irm.agreement import PairAgreement
from tl_reward.results import ShortRepr
from tl_reward.stats.estimate import Estimate


def _result_types() -> list[type]:
    for m in pkgutil.walk_packages(tl_reward.__path__, "tl_reward."):
        if ".cli" not in m.name and not m.name.endswith("__main__"):
            importlib.import_module(m.name)
    todo, out = [ShortRepr], set()
    while todo:
        for sub in todo.pop().__subclasses__():
            out.add(sub)
            todo.append(sub)
    return sorted(out, key=lambda c: f"{c.__module__}.{c.__qualname__}")


def _fake(tp: Any, rng: np.random.Generator, depth: int = 0) -> Any:
    """A value of annotation ``tp`` with odd dtypes and shapes (NaN, float16, int32, ...)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return _fake(next(a for a in args if a is not type(None)), rng, depth)
    if tp is Any or tp is object:
        return {"half": torch.randn(2, 3).half(), ("k", 1): [1, 2.5, None]}
    if tp is str:
        return f"s{rng.integers(100)}"
    if tp is bool:
        return True
    if tp is int:
        return int(rng.integers(1, 9))
    if tp is float:
        return float("nan") if rng.random() < 0.2 else float(rng.normal())
    if tp is Path:
        return Path("runs/x")
    if origin in (list, typing.Sequence) or tp is list:
        return [_fake(args[0] if args else int, rng, depth + 1) for _ in range(2)]
    if origin is tuple:
        return tuple(_fake(a, rng, depth + 1) for a in (args[:1] * 2 if ... in args else args))
    if origin is dict or tp is dict:
        k, v = args or (str, float)
        return {_fake(k, rng, depth + 1): _fake(v, rng, depth + 1) for _ in range(2)}
    name = getattr(tp, "__name__", "")
    if tp is torch.Tensor or name.startswith(("Float[", "Int[", "Bool[")):
        t = torch.randn(2, 3, 1)
        return (t > 0 if name.startswith("Bool") else (t * 9).to(torch.int32)
                if name.startswith("Int") else t.to(torch.bfloat16 if depth else torch.float32))
    if tp is np.ndarray:
        return rng.normal(size=(3, 2)).astype(np.float32)
    if tp is pd.DataFrame:
        return pd.DataFrame({"x": rng.normal(size=3), "n": np.arange(3, dtype=np.int32),
                             "s": ["a", None, "c"], "b": [True, False, True],
                             "c": pd.Categorical(["u", "v", "u"])},
                            index=pd.Index(["p", "q", "r"], name="item"))
    if typing.is_typeddict(tp):
        return {k: _fake(v, rng, depth + 1) for k, v in typing.get_type_hints(tp).items()}
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp, vars(importlib.import_module(tp.__module__)))
        return tp(**{f.name: _fake(hints[f.name], rng, depth + 1)
                     for f in dataclasses.fields(tp) if f.init})
    raise AssertionError(f"no fake value for {tp!r}")


def assert_same(a: Any, b: Any, where: str = "") -> None:
    """Equal value, type, dtype and shape, recursively."""
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), where
    elif isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    elif isinstance(a, float):
        assert a == b or (math.isnan(a) and math.isnan(b)), where
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    else:
        assert a == b, where


TYPES = _result_types()


def test_every_result_type_is_enumerated() -> None:
    names = {c.__name__ for c in TYPES}
    assert {"FaithfulnessReport", "ConflictResult", "ProbeReport", "RankAgreement",
            "VocabSweep", "RewardLens", "DistortionResult"} <= names and len(names) > 40


@pytest.mark.parametrize("cls", TYPES, ids=lambda c: c.__name__)
def test_every_result_round_trips(cls: type, tmp_path: Path) -> None:
    rng = np.random.default_rng(len(cls.__name__))
    result = _fake(cls, rng)
    if cls.__name__ == "VocabSweep":  # its spec-less fake cannot be written as a sweep file
        result.spec = None
        with pytest.raises(TLRewardError, match="no spec"):
            result.save(tmp_path / "r.tlr")
        return
    path = result.save(tmp_path / "r.tlr")
    assert_same(cls.load(path), result)
    assert_same(load_result(path), result)


def test_nested_estimates_and_type_mismatch(tmp_path: Path) -> None:
    from tl_reward.audit.conflict import ConflictResult
    from tl_reward.irm.agreement import PairAgreement

    est = Estimate(0.25, -0.5, 1.0, float("nan"), 7, "m", 0.9)
    res = PairAgreement(est, np.arange(6, dtype=np.int16).reshape(2, 3))
    back = PairAgreement.load(res.save(tmp_path / "a.tlr"))
    assert_same(back, res) and isinstance(back.agreement, Estimate)
    with pytest.raises(TLRewardError, match="holds a tl_reward.irm.agreement:PairAgreement, "
                                            "not a tl_reward.audit.conflict:ConflictResult"):
        ConflictResult.load(tmp_path / "a.tlr")


def test_the_comparison_itself_fails_on_a_dropped_dtype() -> None:
    x = torch.arange(4, dtype=torch.float16)
    with pytest.raises(AssertionError):
        assert_same(x, x.float())
    with pytest.raises(AssertionError):
        assert_same(np.zeros(2, np.float32), np.zeros(2))
    with pytest.raises(AssertionError):
        assert_same((1, 2), [1, 2])


def test_a_real_lens_round_trips(tiny, tmp_path: Path) -> None:  # noqa: ANN001
    from tl_reward.analysis.lens import RewardLens, reward_lens

    model = tiny("llama", 2)[0]
    lens = reward_lens(model, [("Is the sky blue?", "Yes."), ("Hi", "Hello there!")])
    assert_same(RewardLens.load(lens.save(tmp_path / "lens.tlr")), lens)


def test_a_vocabulary_sweep_keeps_its_parquet_file_behind_the_same_names(tiny, tmp_path: Path
                                                                         ) -> None:  # noqa: ANN001
    from tl_reward.sweep.vocab_sweep import VocabSweep, score_vocabulary

    model = tiny("qwen2")[0]
    sweep = score_vocabulary(model, {"a": "Say hi.", "b": "Say no."}, list(range(20)),
                             progress=False)
    path = sweep.save(tmp_path / "s.parquet")
    assert path.read_bytes()[:4] == b"PAR1"  # the sweep store's format
    for back in (VocabSweep.load(path), load_result(path)):
        assert_same(back.scores, sweep.scores)
        assert_same(back.rewards, sweep.rewards)
        assert back.tokens == sweep.tokens and back.labels == sweep.labels


def _crafted(path: Path, value: Any = None, files: dict[str, bytes] | None = None) -> Path:
    """A zip in the result format holding ``value`` (or ``files`` as given)."""
    head = {"format": "tl_reward.result/1", "value": value}
    with zipfile.ZipFile(path, "w") as z:
        for name, data in (files or {"result.json": json.dumps(head).encode()}).items():
            z.writestr(name, data)
    return path


@pytest.mark.parametrize("name", ["tl_reward.cli.__main__:x", "os:system", "i28_probe:Result",
                                  "tl_reward.i28_probe:Result", "tl_reward.cli:main"])
def test_a_file_naming_a_non_result_type_is_refused_and_nothing_runs(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe = ("import pathlib\npathlib.Path(__file__).with_name('ran').touch()\n"
             "class Result:\n  pass\n")
    (tmp_path / "i28_probe.py").write_text(probe)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["tl-reward", "--help"])  # today's bug ran the command line
    for mod in ("tl_reward.cli.__main__", "i28_probe"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    path = _crafted(tmp_path / "x.tlr", {"__dataclass__": name, "fields": {}})
    nested = _crafted(tmp_path / "y.tlr", [1, {"__tuple__": [{"__dataclass__": name,
                                                                "fields": {"a": 1}}]}])
    for p in (path, nested):
        with pytest.raises(ResultFileError, match=f"{name}.*not a tl_reward result type"):
            load_result(p)
    assert not (tmp_path / "ran").exists()
    assert "tl_reward.cli.__main__" not in sys.modules and "i28_probe" not in sys.modules


def test_broken_files_raise_one_error_naming_the_problem(tmp_path: Path) -> None:
    good = PairAgreement(Estimate(0.25, -0.5, 1.0, 0.1, 7, "m", 0.9), np.arange(3)).save(
        tmp_path / "good.tlr")
    with zipfile.ZipFile(good) as z:
        members = {n: z.read(n) for n in z.namelist()}
    head = json.loads(members["result.json"])
    est = head["value"]["fields"]["agreement"]
    cases = {
        "not a saved tl_reward result": (tmp_path / "t.tlr", b"hello"),
        "not a zip|damaged": (tmp_path / "bad.tlr", good.read_bytes()[:60]),
        "no result.json": _crafted(tmp_path / "m.tlr", files={"other.txt": b"x"}),
        "result.json.*JSON": _crafted(tmp_path / "j.tlr", files={"result.json": b"{no"}),
        "format": _crafted(tmp_path / "f.tlr", files={"result.json": b'{"format": 2}'}),
        "array.*missing": _crafted(tmp_path / "a.tlr", files={
            **members, "arrays.npz": np.savez(buf := io.BytesIO()) or buf.getvalue()}),
        "Estimate.*no field 'colour'": _crafted(tmp_path / "u.tlr", {
            **est, "fields": {**est["fields"], "colour": 1}}),
        "Estimate.*value": _crafted(tmp_path / "n.tlr", {**est, "fields": {}}),
        "malformed": _crafted(tmp_path / "d.tlr", {"__dict__": 5}),
    }
    for match, path in cases.items():
        if isinstance(path, tuple):
            path[0].write_bytes(path[1])
            path = path[0]
        with pytest.raises(ResultFileError, match=match):
            load_result(path)
    assert_same(load_result(good), PairAgreement.load(good))  # the good file still loads


@pytest.mark.parametrize("member", ["tensors.pt", "arrays.npz"])
def test_a_tampered_member_is_refused_naming_the_file_and_runs_nothing(
        member: str, tmp_path: Path) -> None:
    """A pickle inside ``tensors.pt`` raised torch's UnpicklingError, whose advice (re-run
    ``torch.load`` with ``weights_only=False``) would run it; an object array in
    ``arrays.npz`` got numpy's advice about ``allow_pickle``."""
    from tl_reward.model.scoring import RewardResult

    good = {"tensors.pt": RewardResult(torch.randn(2, 1), ["score"], torch.randn(2), None,
                                       torch.tensor([3, 4])),
            "arrays.npz": PairAgreement(Estimate(0.25, -0.5, 1.0, 0.1, 7, "m", 0.9),
                                        np.arange(3.0))}[member]
    path = good.save(tmp_path / "good.tlr")
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    assert member in members  # the file is valid but for the one member replaced below
    marker = tmp_path / "payload-ran"
    buf = io.BytesIO()
    if member == "tensors.pt":
        torch.save({"tensor0": PicklePayload(marker)}, buf)
    else:
        np.savez(buf, array0=np.array([PicklePayload(marker)], dtype=object))
    bad = _crafted(tmp_path / "bad.tlr", files={**members, member: buf.getvalue()})
    with pytest.raises(ResultFileError) as err:
        load_result(bad)
    msg = str(err.value)
    assert str(bad) in msg and repr(member) in msg and "tampered" in msg
    assert "weights_only" not in msg and "allow_pickle" not in msg and "do not load it" in msg
    assert err.value.__cause__ is None and err.value.__suppress_context__  # torch's advice hidden
    assert not marker.exists()
    assert_same(load_result(path), good)  # the untouched file still loads


def test_a_result_of_a_module_not_yet_imported_loads(tmp_path: Path) -> None:
    """A fresh process: the type's module is imported from the fixed list, only then."""
    from tl_reward.stats.agreement import RankAgreement

    saved = _fake(RankAgreement, np.random.default_rng(0)).save(tmp_path / "r.tlr")
    code = ("import sys; from tl_reward import load_result; m = 'tl_reward.stats.agreement'; "
            "before = m in sys.modules; r = load_result(sys.argv[1]); "
            "print(before, type(r).__module__, type(r).__name__)")
    out = subprocess.run([sys.executable, "-c", code, str(saved)], capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["False", "tl_reward.stats.agreement", "RankAgreement"]


def test_every_result_type_lives_in_a_listed_module() -> None:
    from tl_reward import results

    assert set(results._TYPES.values()) >= set(TYPES)
    assert {c.__module__ for c in results._TYPES.values()} <= set(results.RESULT_MODULES)
