"""Generate reference / counterfactual prompt pairs from the templates (Zhang et al. 2024, section 3).

The reference prompt X_r is a few-shot prefix of solved examples of the same template (each ended by a
newline) followed by the final query; the counterfactual X_c is the same text with the operator of the final
query only replaced by the template's irrelevant counterfactual operator. Small models need the prefix:
zero-shot SmolLM2-135M answers at chance, three examples give ~0.7-0.8 first-digit accuracy (METHODS.md 1).

Problems: subtraction only where A - B >= 0, division only where exact and B != 0; by default the answer
is a single digit 0-9 (one token in digit-splitting tokenizers). For small operand ranges all valid
problems are enumerated and drawn in shuffled cycles (few repeats); for large ranges each operation has a
direct sampler that only proposes valid problems. Each template gets its own local RNG seeded by
(seed, template id), so adding a template never changes another template's prompts. Where one answer holds most
of the enumerated problems (division 10-99: n / n = 1), the queries are drawn evenly over the answer values,
and generated prompts that one answer still dominates are named in a warning (`data/answer_balance.py`).

`keep` (optional) restricts the queries to the problems it accepts, e.g. facts no other prompt set used
(`data/heldout.py`); the solved examples are still drawn from every valid problem, and a template left with no
accepted problem gives no pairs (a sampled range gives up after `_KEEP_TRIES` rejected draws).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from arithmech.data.answer_balance import AnswerCycle, dominant, warn_dominant
from arithmech.data.prompts import PromptPair
from arithmech.data.templates import FORMATIONS, OPERATIONS, Template, load_templates, select_templates
from arithmech.errors import ConfigError

logger = logging.getLogger(__name__)

_ENUMERATE_MAX_RANGE = 200  # operand ranges up to this size are enumerated exhaustively
_DIGIT_CAP = 9
_KEEP_TRIES = 1000  # draws of a sampled range before `keep` is taken to accept none of its problems

Problem = tuple[int, int]
Keep = Callable[[str, Problem], bool]
"""keep(operation, (a, b)): whether the problem may be a query."""


@dataclass(frozen=True)
class GenerationConfig:
    """Which templates to use and how to draw operands; lists given for tuple fields become tuples."""

    operations: tuple[str, ...] = field(default=OPERATIONS, metadata={"help": "operations to include"})
    formations: tuple[str, ...] = field(default=FORMATIONS, metadata={"help": "formations to include"})
    template_ids: tuple[str, ...] | None = field(
        default=None, metadata={"help": "only these template ids (None: all matching the filters above)"}
    )
    n_per_template: int = field(default=32, metadata={"help": "prompt pairs generated per template"})
    operand_min: int = field(default=0, metadata={"help": "smallest operand (>= 0)"})
    operand_max: int = field(default=9, metadata={"help": "largest operand (>= operand_min)"})
    few_shot: int = field(
        default=3, metadata={"help": "solved examples of the same template before the query"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the local random generators"})
    single_digit_answer: bool = field(
        default=True, metadata={"help": "keep only problems whose answer is one digit 0-9"}
    )

    def __post_init__(self) -> None:
        for name in ("operations", "formations", "template_ids"):
            value = getattr(self, name)
            if isinstance(value, list):  # YAML gives lists; store the tuple so the config stays hashable
                object.__setattr__(self, name, tuple(value))
        _check_choice("operations", self.operations, OPERATIONS)
        _check_choice("formations", self.formations, FORMATIONS)
        if self.template_ids is not None and (
            not isinstance(self.template_ids, tuple)
            or not self.template_ids
            or not all(isinstance(t, str) for t in self.template_ids)
        ):
            raise ConfigError("template_ids must be a non-empty list of template id strings, or None for all")
        _check_int("n_per_template", self.n_per_template, 1)
        _check_int("operand_min", self.operand_min, 0)
        _check_int("operand_max", self.operand_max, 0)
        _check_int("few_shot", self.few_shot, 0)
        _check_int("seed", self.seed, None)
        if self.operand_max < self.operand_min:
            raise ConfigError(
                f"operand_max ({self.operand_max}) is below operand_min ({self.operand_min}); "
                "set operand_max >= operand_min"
            )
        if not isinstance(self.single_digit_answer, bool):
            raise ConfigError("single_digit_answer must be true or false")


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if not isinstance(value, tuple) or not value or any(v not in allowed for v in value):
        raise ConfigError(f"{name} must be a non-empty list drawn from {', '.join(allowed)}; got {value!r}")


def _check_int(name: str, value: object, minimum: int | None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer; got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}; got {value}")


def solve(operation: str, a: int, b: int) -> int | None:
    """The answer of `a op b`, or None where the problem is not allowed (negative or inexact result)."""
    if operation == "addition":
        return a + b
    if operation == "subtraction":
        return a - b if a >= b else None
    if operation == "multiplication":
        return a * b
    if operation == "division":
        return a // b if b != 0 and a % b == 0 else None
    raise ConfigError(f"unknown operation '{operation}'; use one of {', '.join(OPERATIONS)}")


def generate_pairs(
    cfg: GenerationConfig, templates: list[Template] | None = None, keep: Keep | None = None, log: bool = True
) -> list[PromptPair]:
    """Generate `cfg.n_per_template` prompt pairs for every selected template (queries among the problems `keep`
    accepts, if given: see the module docstring); same arguments => same list. `log=False` leaves out the lines
    that say what was generated (a planner that only counts the pairs); warnings stay."""
    chosen = _choose_templates(cfg, load_templates() if templates is None else templates)
    pairs: list[PromptPair] = []
    notes: dict[str, None] = {}
    for template in chosen:
        rng = random.Random(f"{cfg.seed}:{template.id}")
        source = _problem_source(template, cfg, keep)
        if source is None:
            if log:
                logger.info("template %s: no problem of operands %d-%d is accepted as a query", template.id,
                            cfg.operand_min, cfg.operand_max)  # fmt: skip
            continue
        notes[source.note] = None
        for _ in range(cfg.n_per_template):
            query = source.next_query(rng)
            examples = source.examples(rng, cfg.few_shot, exclude=query)
            pairs.append(build_pair(template, query, examples))
    if log:
        logger.info("generated %d prompt pairs from %d templates", len(pairs), len(chosen))
        for note in filter(None, notes):
            logger.info(note)
    warn_dominant(pairs, "generated prompts", f"operand ranges of at most {_ENUMERATE_MAX_RANGE} values draw their "
                  "queries evenly over the answers: choose one (--operand-min, --operand-max)")
    if cfg.single_digit_answer and cfg.operand_max > _DIGIT_CAP:
        logger.warning(
            "operands %d-%d: only problems with a single-digit answer (0-9) were generated, one token on every "
            "tokenizer; --answer-digits (identify, knockout) keeps the others, scored digit by digit",
            cfg.operand_min, cfg.operand_max,
        )  # fmt: skip
    return pairs


def build_pair(template: Template, query: Problem, examples: list[Problem]) -> PromptPair:
    """One PromptPair: solved `examples` (one per line) then `query`; only the query's operator is swapped."""
    prefix = "".join(
        template.render(str(a), str(b)).text + str(solve(template.operation, a, b)) + "\n"
        for a, b in examples
    )
    a, b = (str(x) for x in query)
    ref = template.render(a, b)
    cf = template.render(a, b, counterfactual=True)
    answer = solve(template.operation, *query)
    if answer is None:
        raise ConfigError(f"{a} {template.operation} {b} has no valid answer; choose operands with one")
    spans = {name: (start + len(prefix), end + len(prefix)) for name, (start, end) in ref.spans.items()}
    spans["prefix"] = (0, len(prefix))
    return PromptPair(
        reference=prefix + ref.text,
        counterfactual=prefix + cf.text,
        answer=str(answer),
        template_id=template.id,
        operation=template.operation,
        formation=template.formation,
        a=a,
        b=b,
        spans=spans,
    )


def _choose_templates(cfg: GenerationConfig, templates: list[Template]) -> list[Template]:
    if cfg.template_ids is not None:
        known = {t.id for t in templates}
        unknown = [t for t in cfg.template_ids if t not in known]
        if unknown:
            raise ConfigError(f"template ids {', '.join(unknown)} are not among the templates; check the ids")
    chosen = select_templates(templates, cfg.operations, cfg.formations, cfg.template_ids)
    if not chosen:
        raise ConfigError(
            "no template matches the chosen operations, formations and template_ids; widen the filters"
        )
    return chosen


class _ProblemSource:
    """Draws valid (A, B) problems for one template: shuffled cycles over a list, or a direct sampler."""

    def __init__(
        self,
        pool: list[Problem] | None,
        sampler: Callable[[random.Random], Problem] | None,
        balanced: AnswerCycle | None = None,
        examples_pool: list[Problem] | None = None,
        example_sampler: Callable[[random.Random], Problem] | None = None,
    ) -> None:
        self._pool = pool
        self._sampler = sampler
        self._balanced = balanced
        self._examples_pool = pool if examples_pool is None else examples_pool
        """Where solved examples come from: every valid problem, also those the queries may not be."""
        self._example_sampler = sampler if example_sampler is None else example_sampler
        self._queue: list[Problem] = []
        self.note = ""
        """Why the queries are balanced over answer values, if they are."""

    def next_query(self, rng: random.Random) -> Problem:
        if self._sampler is not None:
            return self._sampler(rng)
        if self._balanced is not None:
            return self._balanced.next_query(rng)
        assert self._pool is not None
        if not self._queue:
            self._queue = list(self._pool)
            rng.shuffle(self._queue)
        return self._queue.pop()

    def examples(self, rng: random.Random, k: int, exclude: Problem) -> list[Problem]:
        """`k` solved examples with other operands than `exclude` where the range allows it."""
        if k == 0:
            return []
        if self._example_sampler is not None:
            return [self._draw_other(rng, exclude) for _ in range(k)]
        assert self._examples_pool is not None
        others = [p for p in self._examples_pool if p != exclude] or [exclude]
        return rng.sample(others, k) if len(others) >= k else rng.choices(others, k=k)

    def _draw_other(self, rng: random.Random, exclude: Problem) -> Problem:
        assert self._example_sampler is not None
        problem = self._example_sampler(rng)
        for _ in range(100):
            if problem != exclude:
                break
            problem = self._example_sampler(rng)
        return problem


def _problem_source(template: Template, cfg: GenerationConfig, keep: Keep | None = None) -> _ProblemSource | None:
    """Where a template's queries and solved examples come from; None when `keep` accepts none of its problems."""
    lo, hi = cfg.operand_min, cfg.operand_max
    op = template.operation
    cap = _DIGIT_CAP if cfg.single_digit_answer else None
    if hi - lo + 1 <= _ENUMERATE_MAX_RANGE:
        valid = [(a, b) for a in range(lo, hi + 1) for b in range(lo, hi + 1) if _valid(op, a, b, cap)]
        if not valid:
            raise _no_problem(template, cfg)
        pool = valid if keep is None else [p for p in valid if keep(op, p)]  # the queries'
        if not pool:
            return None
        by_answer: dict[int, list[Problem]] = {}
        for a, b in pool:
            by_answer.setdefault(solve(op, a, b) or 0, []).append((a, b))
        common = dominant([solve(op, a, b) for a, b in pool])
        if common is None:
            return _ProblemSource(pool, None, examples_pool=valid)
        source = _ProblemSource(pool, None, AnswerCycle(by_answer), examples_pool=valid)
        source.note = (f"{op}: the answer {common[0]} holds {common[1]} of the {len(pool)} valid "
                       f"problems with operands {lo}-{hi}, so queries are drawn evenly over its {len(by_answer)} "
                       "answer values")  # fmt: skip
        return source
    sampler = _direct_sampler(op, lo, hi, cap)
    if sampler is None:
        raise _no_problem(template, cfg)
    if keep is None:
        return _ProblemSource(None, sampler)
    probe = random.Random(f"{cfg.seed}:{template.id}:probe")
    if not any(keep(op, sampler(probe)) for _ in range(100)):
        return None  # 100 draws, none accepted: (nearly) every problem of this range is excluded
    return _ProblemSource(None, _kept_sampler(sampler, op, keep), example_sampler=sampler)


def _kept_sampler(
    sampler: Callable[[random.Random], Problem], operation: str, keep: Keep
) -> Callable[[random.Random], Problem]:
    """`sampler` redrawn until `keep` accepts the problem (at most `_KEEP_TRIES` draws)."""

    def draw(rng: random.Random) -> Problem:
        for _ in range(_KEEP_TRIES):
            problem = sampler(rng)
            if keep(operation, problem):
                return problem
        raise ConfigError(f"{_KEEP_TRIES} draws of {operation} problems in a row were all excluded; widen the "
                          "operand range")  # fmt: skip

    return draw


def _valid(operation: str, a: int, b: int, cap: int | None) -> bool:
    answer = solve(operation, a, b)
    return answer is not None and (cap is None or answer <= cap)


def _no_problem(template: Template, cfg: GenerationConfig) -> ConfigError:
    digit = " with a single-digit answer" if cfg.single_digit_answer else ""
    return ConfigError(
        f"operands {cfg.operand_min}-{cfg.operand_max} admit no valid {template.operation} problem{digit} "
        f"for template '{template.id}'; widen the operand range, or keep answers of several digits with "
        "--answer-digits (single_digit_answer false), scored digit by digit"
    )


def _direct_sampler(
    operation: str, lo: int, hi: int, cap: int | None
) -> Callable[[random.Random], Problem] | None:
    """A sampler proposing only valid (not uniformly drawn) problems for a large range, or None if none."""
    if operation == "addition":
        if cap is not None and 2 * lo > cap:
            return None
        return lambda rng: _draw_addition(rng, lo, hi, cap)
    if operation == "subtraction":
        return lambda rng: _draw_subtraction(rng, lo, hi, cap)
    if operation == "multiplication":
        if cap is not None and lo * lo > cap:
            return None
        return lambda rng: _draw_multiplication(rng, lo, hi, cap)
    if max(lo, 1) > hi:
        return None
    return lambda rng: _draw_division(rng, lo, hi, cap)


def _draw_addition(rng: random.Random, lo: int, hi: int, cap: int | None) -> Problem:
    a = rng.randint(lo, hi if cap is None else min(hi, cap - lo))
    return a, rng.randint(lo, hi if cap is None else min(hi, cap - a))


def _draw_subtraction(rng: random.Random, lo: int, hi: int, cap: int | None) -> Problem:
    b = rng.randint(lo, hi)
    return rng.randint(b, hi if cap is None else min(hi, b + cap)), b


def _draw_multiplication(rng: random.Random, lo: int, hi: int, cap: int | None) -> Problem:
    if cap is None:
        return rng.randint(lo, hi), rng.randint(lo, hi)
    a = rng.randint(lo, min(hi, cap if lo == 0 else cap // lo))
    return a, rng.randint(lo, hi if a == 0 else min(hi, cap // a))


def _draw_division(rng: random.Random, lo: int, hi: int, cap: int | None) -> Problem:
    b = rng.randint(max(lo, 1), hi)
    q_hi = hi // b if cap is None else min(hi // b, cap)
    q = rng.randint(-(-lo // b), q_hi)  # ceil(lo / b) <= 1 <= q_hi, since lo <= b <= hi
    return b * q, b
