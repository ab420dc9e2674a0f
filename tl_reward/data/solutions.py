"""The shapes of a process reward model's inputs (a solution, a pair of solutions) and the one
way a reply is cut into steps."""

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


#: What separates the steps of an untagged reply: a blank line, as the published PRMs cut it.
STEP_BREAK = "\n\n"


def split_steps(reply: str, sep: str = STEP_BREAK) -> list[str]:
    """A reply's steps: its ``sep``-separated parts, surrounding whitespace stripped, empty
    parts dropped (so a triple newline is one break)."""
    return [p.strip() for p in reply.split(sep) if p.strip()]


def as_reply_pair(item: Any) -> Any:
    """``(question, [steps])`` as ``(question, reply)`` (the steps joined by
    :data:`STEP_BREAK`); any other input as it is."""
    return (item[0], STEP_BREAK.join(item[1])) if is_steps_input(item) else item
