"""The shapes of a process reward model's inputs: a solution and a pair of solutions."""

from __future__ import annotations

from typing import Any


def is_steps_input(item: Any) -> bool:
    """True for ``(question, [step, step, ...])``: a solution given as its steps."""
    return (isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], list)
            and all(isinstance(s, str) for s in item[1]))


def is_solution_pair(item: Any) -> bool:
    """True for ``(solution_a, solution_b)``: two solutions (not text) compared at a step."""
    return (isinstance(item, tuple) and len(item) == 2 and not is_steps_input(item)
            and not any(isinstance(x, str) for x in item))
