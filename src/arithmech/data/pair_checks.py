"""Whether a prompt pair measures what its numbers will claim, and messages that name the lines that fail.

Background
    Every effect arithmech reports is a change of the logit (or probability) of one token C at the last
    prompt token END, when activations of the counterfactual replace those of the reference (Zhang et al.
    2024, section 4.1). Some mistakes in a pair make that number meaningless without any error:

    - C is not the answer. C is the first token of the answer as it follows the prompt. An answer "12" on a
      digit-splitting tokenizer scores only "1"; an answer " 8" after "=" on a tokenizer with separate space
      tokens scores the space, so every effect measures predicting a space.
    - The counterfactual changes nothing: it is the reference, or it tokenizes to the same ids. Each patch
      then moves the logit by float noise (1e-8), which ranks as "top heads", and the whole-prompt effect
      is 0, so every share of it is undefined.

    Such a pair is refused, not skipped: the fix is in the user's file. (A counterfactual of another token
    length is different: the generated templates give some on some tokenizers, so those pairs are rejected,
    counted and named, `tokens.tokenize_pairs`.)

Rules
    text (`text_problem`, no tokenizer, also checked as a prompt file is read):
        the answer has no space after it, and none before it when the reference already ends with one; the
        reference does not already end with a numeric answer ("3 + 5 = 8"); the counterfactual is not the
        reference itself.
    tokens (`answer_problem`, `counterfactual_problem`):
        the answer as it follows the reference is one token that decodes to the answer itself (the number,
        not a space or a piece of it). A space merged into the number (GPT-2's " 8") is fine: the
        reference's trailing space then moves into the answer's token (`tokens.answer_target`), and the
        change is reported. The counterfactual's tokens differ from the reference's.
    An answer that is not a number (a word) is measured as given, if it is one token.
    answers scored token by token (`answer_tokens_problem`, --answer-digits): the tokens spell the answer and
        each is one digit, so each has one place value (`places.py`).

Messages
    `Findings` groups the failing rows by what is wrong and names them the same way everywhere: the file and
    its line numbers (the first five, then a count), or, for pairs made in memory, their numbers and
    templates. One DataError names the first kind of problem and counts the rest.

Usage
    >>> findings = Findings(total=len(pairs), noun="pair")
    >>> for number, pair in enumerate(pairs, 1):
    ...     findings.add(pair_location(pair, number), text_problem(pair))
    >>> findings.refuse()          # DataError: "prompt file p.jsonl, lines 3 and 7 (2 of 40 pairs): ..."
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from arithmech.data.places import is_one_digit
from arithmech.data.prompts import PromptPair
from arithmech.errors import DataError

_NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?")
_SHOWN = 5  # row numbers named in a message; the rest are counted


@dataclass(frozen=True)
class Problem:
    """What is wrong with a row (the same text for every row it applies to), an example, and the fix."""

    what: str
    example: str
    fix: str


@dataclass(frozen=True)
class Location:
    """Where a row is: line `number` of file `source`, or pair `number` (of `template`) when made in memory."""

    number: int
    source: str | None = None
    template: str | None = None


def pair_location(pair: PromptPair, number: int) -> Location:
    """The pair's file and line when it was read from a file, else its 1-based `number` and template."""
    if pair.source is not None and pair.line is not None:
        return Location(pair.line, pair.source)
    return Location(number, None, pair.template_id)


@dataclass
class Findings:
    """Rows with problems, grouped by what is wrong, in the order first seen."""

    total: int
    noun: str = "pair"
    groups: dict[str, tuple[Problem, list[Location]]] = field(default_factory=dict)

    def add(self, where: Location, problem: Problem | None) -> None:
        if problem is not None:
            self.groups.setdefault(problem.what, (problem, []))[1].append(where)

    def refuse(self) -> None:
        """Raise one DataError for the first kind of problem: where, what (an example) and the fix, and a count
        of the rows with other problems."""
        if not self.groups:
            return
        (problem, rows), *others = self.groups.values()
        rest = sum(len(more) for _, more in others)
        tail = f" ({rest} other {self.noun}{'s' if rest != 1 else ''} with other problems)" if rest else ""
        where = describe(rows, self.total, self.noun)
        raise DataError(f"{where}: {problem.what} ({problem.example}); {problem.fix}{tail}")


def describe(rows: list[Location], total: int, noun: str = "pair") -> str:
    """"prompt file p.jsonl, lines 3, 5 and 9 (3 of 40 pairs)", or "pairs 2 and 7 (templates t1 and t2) (2 of 9
    pairs)" for pairs made in memory."""
    first = rows[0]
    numbers = sorted({r.number for r in rows})
    if first.source is not None:
        head = f"prompt file {first.source}, {_numbered('line', numbers)}"
    else:
        templates = sorted({r.template for r in rows if r.template})
        kinds = f"template{'s' if len(templates) > 1 else ''} {_listed(templates)}" if templates else ""
        head = _numbered(noun, numbers) + (f" ({kinds})" if kinds else "")
    return head + (f" ({len(numbers)} of {total} {noun}s)" if total > 1 else "")


def _numbered(noun: str, numbers: list[int]) -> str:
    return f"{noun}{'s' if len(numbers) > 1 else ''} {_listed([str(n) for n in numbers])}"


def _listed(items: list[str]) -> str:
    """"a", "a and b", "a, b and c", "a, b, c, d, e and 3 more"."""
    if len(items) > _SHOWN:
        return f"{', '.join(items[:_SHOWN])} and {len(items) - _SHOWN} more"
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def text_problem(pair: PromptPair, counterfactual_required: bool = True) -> Problem | None:
    """The first text rule (module docstring) the pair breaks, or None."""
    answer, reference = pair.answer, pair.reference
    if not answer.strip() or answer != answer.rstrip():
        return Problem(
            "the answer ends with a space, which would be scored as part of it",
            f"answer {answer!r}",
            f"write the answer without it{f' ({answer.strip()!r})' if answer.strip() else ''}",
        )
    if answer != answer.lstrip() and reference != reference.rstrip():
        return Problem(
            "the reference ends with a space and the answer starts with one, so the model would have to write "
            "two spaces",
            f"answer {answer!r}",
            f"write the answer as {answer.strip()!r}: the reference's space moves into the answer's token where "
            "the tokenizer merges them",
        )
    before = reference.rstrip()[: -len(answer.strip())]
    if _NUMBER.fullmatch(answer.strip()) and reference.rstrip().endswith(answer.strip()) and not before[-1:].isdigit():
        return Problem(
            "the reference already ends with the answer, so the model is asked for what comes after it",
            f"{_tail(reference)} with answer {answer!r}",
            f"end the reference where the answer starts ({_tail(before.rstrip() + ' ')})",
        )
    if counterfactual_required and pair.counterfactual == reference:
        return Problem(
            "the counterfactual is the reference itself, so patching it changes nothing",
            _tail(reference),
            "change the operator in the counterfactual (\"3 @ 5 = \"), keeping its token length",
        )
    return None


def answer_problem(tokenizer: Any, pair: PromptPair, answer_ids: list[int]) -> Problem | None:
    """None if `answer_ids` (the answer's tokens after the reference) is one token that decodes to the answer."""
    pieces = [str(tokenizer.decode([token_id])) for token_id in answer_ids]
    shown = f"answer {pair.answer!r} -> {', '.join(repr(p) for p in pieces)}"
    if len(pieces) == 1 and pieces[0].strip() == pair.answer.strip():
        return None
    if not pieces[0].strip():
        return Problem(
            "the answer's first token is a space, so every effect would measure predicting a space",
            shown,
            f"write the answer as {pair.answer.strip()!r} and end the reference with the space "
            f"({_tail(pair.reference.rstrip() + ' ')}); it moves into the answer's token where the tokenizer merges "
            "them",
        )
    if len(pieces) > 1:
        return Problem(
            "the answer is more than one token (the tokenizer has no single token for it), and only its first "
            "token would be scored",
            shown,
            "score the answer token by token with --answer-digits (teacher forcing), or use a single-token answer",
        )
    return Problem(
        "the answer's token is not the answer itself",
        shown,
        "end the reference where the answer starts, so the answer is a whole token",
    )


def answer_tokens_problem(
    tokenizer: Any, pair: PromptPair, answer_ids: list[int], one_digit: bool = True
) -> Problem | None:
    """None if `answer_ids` (the answer's tokens after the reference) decode to the answer, the first not a space,
    each one digit (so each has one place value, `places.py`): the rule of an answer scored token by token
    (`tokens.tokenize_pairs(..., answer_digits=True)`). one_digit=False drops the last rule: whole answers
    scored token by token where no per-place table is made (transfer's multi-digit and decimal targets)."""
    pieces = [str(tokenizer.decode([token_id])) for token_id in answer_ids]
    shown = f"answer {pair.answer!r} -> {', '.join(repr(p) for p in pieces)}"
    if len(pieces) == 1 or not pieces[0].strip():
        problem = answer_problem(tokenizer, pair, answer_ids)  # one token, or a space first
        if problem is not None:
            return problem
    elif "".join(pieces).strip() != pair.answer.strip():
        return Problem(
            "the answer's tokens are not the answer itself",
            shown,
            "end the reference where the answer starts, so the answer's tokens spell it",
        )
    if not one_digit or all(is_one_digit(piece) for piece in pieces):
        return None
    return Problem(
        "an answer token is not one digit, so it has no one place value (units, tens, ...) to be reported at",
        shown,
        "--answer-digits scores whole numbers on a tokenizer that writes one digit per token (SmolLM2, Llama 2, "
        "Gemma, Qwen2); leave it off to score answers of one token",
    )


def counterfactual_problem(pair: PromptPair, ref_ids: list[int], cf_ids: list[int]) -> Problem | None:
    """A problem if the counterfactual's tokens are the reference's: it changes nothing the model sees."""
    if ref_ids != cf_ids:
        return None
    return Problem(
        "the counterfactual tokenizes to the reference's tokens, so patching it changes nothing the model sees",
        f"{_tail(pair.reference)} vs {_tail(pair.counterfactual)}",
        "change the operator in the counterfactual (\"3 @ 5 = \"), keeping its token length",
    )


def _tail(text: str, width: int = 30) -> str:
    """The end of a prompt, quoted, for a message."""
    return repr(text if len(text) <= width else "..." + text[-width:])
