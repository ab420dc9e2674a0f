"""Results that print short: what they are, their shapes and their headline numbers.

A result dataclass inherits :class:`ShortRepr` and is declared ``@dataclass(repr=False)`` (a
dataclass would otherwise write its own ``__repr__``, which prints every tensor whole).

Example:
    >>> lens
    RewardLens
      rewards: Tensor[2, 5, 1] float32, range [-1.26, 0.4107]
      layer_names: list[5]: 'embed', 'L0', 'L1', ...
"""

from __future__ import annotations

import dataclasses
from typing import Any

_WIDTH = 60


def _num(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, float) else repr(x)


def _array(kind: str, shape: tuple[int, ...], dtype: str, values: Any) -> str:
    """``Tensor[2, 3] float32, range [lo, hi]``, or the values themselves when few."""
    flat = values.reshape(-1).tolist()
    if len(flat) <= 6:
        return f"{kind}[{', '.join(map(str, shape))}] {dtype}: [{', '.join(map(_num, flat))}]"
    text = f"{kind}[{', '.join(map(str, shape))}] {dtype}"
    finite = [v for v in flat if isinstance(v, float | int) and v == v]
    if finite and not isinstance(finite[0], bool):
        text += f", range [{_num(min(finite))}, {_num(max(finite))}]"
    return text


def describe(value: Any) -> str:
    """One short line for a field: a shape and range for arrays, a count for containers."""
    import numpy as np
    import pandas as pd
    import torch

    if isinstance(value, torch.Tensor):
        v = value.detach().cpu()
        return _array("Tensor", tuple(v.shape), str(v.dtype).removeprefix("torch."),
                      v.float() if v.is_floating_point() else v)
    if isinstance(value, np.ndarray):
        return _array("ndarray", value.shape, str(value.dtype), value)
    if isinstance(value, pd.DataFrame):
        cols = list(map(str, value.columns))
        more = ", ..." if len(cols) > 6 else ""
        return f"DataFrame[{len(value)} rows x {len(cols)}: {', '.join(cols[:6])}{more}]"
    if isinstance(value, pd.Series):
        return f"Series[{len(value)}]"
    if isinstance(value, list | tuple):
        name = type(value).__name__
        if not value:
            return f"{name}[0]"
        head = ", ".join(describe(x) for x in value[:3])
        text = f"{name}[{len(value)}]: {head}{', ...' if len(value) > 3 else ''}"
        short = f"{name}[{len(value)}]: {describe(value[0])}, ..."
        return text if len(text) <= 2 * _WIDTH else short
    if isinstance(value, dict):
        keys = ", ".join(map(str, list(value)[:5]))
        return f"dict[{len(value)}]: {keys}{', ...' if len(value) > 5 else ''}"
    if isinstance(value, float | int | bool) or value is None:
        return _num(value)
    if isinstance(value, str):
        return repr(value if len(value) <= _WIDTH else value[:_WIDTH] + "...")
    if isinstance(value, ShortRepr):  # a nested result: its first two fields
        inner = [line.strip() for line in repr(value).splitlines()[1:3]]
        return f"{type(value).__name__}({'; '.join(inner)}{'; ...' if inner else ''})"
    text = repr(value)
    return text if len(text) <= _WIDTH and "\n" not in text else type(value).__name__


class ShortRepr:
    """Mixin for result dataclasses: ``repr`` lists each field's shape or value, one a line,
    then :meth:`headline` (the numbers a reader looks for first)."""

    def headline(self) -> dict[str, Any]:
        """Headline numbers printed after the fields (none unless a result says)."""
        return {}

    def __repr__(self) -> str:
        lines = [type(self).__name__]
        fields = dataclasses.fields(self) if dataclasses.is_dataclass(self) else ()  # type: ignore[arg-type]
        for f in fields:
            if f.repr:
                lines.append(f"  {f.name}: {describe(getattr(self, f.name))}")
        lines += [f"  {k}: {describe(v)}" for k, v in self.headline().items()]
        return "\n".join(lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython
        p.text(repr(self))
