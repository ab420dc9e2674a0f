"""Generated multi-step arithmetic solutions with per-step labels, for process reward models.

A question adds and subtracts a few small numbers ("Compute 8 + 7 + 9 - 6."); its solution
works left to right, one operation a step ("8 + 7 = 15", "15 + 9 = 24", "24 - 6 = 18"), and
ends with "The answer is 18.". Each step is right or wrong by construction: with probability
``error_rate`` one operation (chosen uniformly) writes a wrong result, off by a small amount
(:data:`ERROR_OFFSETS`: a slip of 1-3 or a carry slip of 10), and the later steps continue
correctly from the wrong value. A step's label is 1 when it and every step before it are
correct, else 0 (the first error and everything after it are 0, as PRM training data labels
them); the final "The answer is ..." step is 1 exactly when the solution has no error.

The defaults keep numbers small (single digits added to or taken from a running value between 0
and about 50): SmolLM2's tokenizer writes each digit as one token, and SmolLM2-135M predicts
the first digit of such a sum about 9 times in 10 (of a sum of two-digit numbers, under half).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

#: What a wrong step adds to the right result.
ERROR_OFFSETS: tuple[int, ...] = (-10, -3, -2, -1, 1, 2, 3, 10)
#: A subtraction never takes the running value below this (so a wrong value stays >= 0).
FLOOR = 10


@dataclass(frozen=True)
class ArithmeticSolution:
    """One generated solution.

    Attributes:
        question: ``"Compute a + b - c."``.
        steps: one step per operation, then ``"The answer is N."``.
        labels: per step, 1 when it and every step before it are correct, else 0.
        first_error: the index of the wrong step, or ``None`` when every step is right.
        answer: the question's true answer.
        offset: what the wrong step added to its right result (one of
            :data:`ERROR_OFFSETS`), or ``None``.
    """

    question: str
    steps: tuple[str, ...]
    labels: tuple[int, ...]
    first_error: int | None
    answer: int
    offset: int | None = None

    def as_input(self) -> tuple[str, list[str]]:
        """The ``(question, [steps])`` input a process reward model scores."""
        return self.question, list(self.steps)


def generate_solution(rng: random.Random, error_rate: float = 0.5,
                      n_terms: tuple[int, int] = (3, 5), first: tuple[int, int] = (2, 9),
                      max_operand: int = 9) -> ArithmeticSolution:
    """One solution from ``rng``: ``n_terms`` numbers (an inclusive range), the first in
    ``first``, the others in ``[2, max_operand]``; a wrong step with probability
    ``error_rate``."""
    k = rng.randint(*n_terms)
    wrong = rng.randrange(k - 1) if rng.random() < error_rate else None
    offset = None
    shown = rng.randint(*first)
    true = shown
    expr, steps = [str(shown)], []
    for i in range(k - 1):
        if shown >= FLOOR + 2 and rng.random() < 0.5:
            op, b = "-", rng.randint(2, min(max_operand, shown - FLOOR))
        else:
            op, b = "+", rng.randint(2, max_operand)
        sign = 1 if op == "+" else -1
        result = shown + sign * b
        if i == wrong:
            offset = rng.choice([d for d in ERROR_OFFSETS if result + d >= 0])
            result += offset
        steps.append(f"{shown} {op} {b} = {result}")
        expr.append(f"{op} {b}")
        true += sign * b
        shown = result
    steps.append(f"The answer is {shown}.")
    labels = tuple(int(wrong is None or i < wrong) for i in range(k))
    return ArithmeticSolution(f"Compute {' '.join(expr)}.", tuple(steps), labels, wrong, true,
                              offset)


def generate_solutions(n: int, seed: int, error_rate: float = 0.5,
                       n_terms: tuple[int, int] = (3, 5), first: tuple[int, int] = (2, 9),
                       max_operand: int = 9) -> list[ArithmeticSolution]:
    """``n`` solutions from a ``random.Random(seed)`` (:func:`generate_solution`): the same
    seed gives the same solutions."""
    rng = random.Random(seed)
    return [generate_solution(rng, error_rate, n_terms, first, max_operand) for _ in range(n)]
