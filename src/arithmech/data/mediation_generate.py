"""Build mediation prompt pairs for every task: arithmetic, number retrieval and factual recall.

Each task has a maker that draws one base prompt and its alternative for an intervention type (the types and
tasks are described in `mediation_prompts.py`):

    arithmetic   draw A, B with result r = solve(op, A, B); the alternative draws other operands with
                 r' != r (operands-and-result), other operands (A', B') != (A, B) with solve(op, A', B') = r
                 (operands-same-result), or keeps A, B under another operation with r' != r (operator)
    retrieval    "{NAME} has {A} {X} and {B} {Y}. How many {Q} ...": the alternative changes the number asked
                 for (operands-and-result) or the other number (operands-same-result)
    factual      a subject {S} of a relation; the alternative is another subject with a different answer

Choices (where Stolfo et al. are silent or their models differ):
- an optional few-shot prefix of solved examples of the same template (default 3: SmolLM2-135M is at chance
  zero-shot, METHODS.md sec. 1), identical in base and alternative, so only the final query differs; for the
  operator type the examples show the base operation;
- operands `operand_min..operand_max` (default single digits) and results capped by `result_max` (default 9,
  one token in digit-splitting tokenizers); subtraction only where A >= B, division only where exact;
- an operator swap only between operator words with the same number of words ("divided by" only swaps with
  itself), since base and alternative must have the same token length (mismatches are still rejected, and
  counted, when tokenizing). A template/type combination that admits no pair is skipped and logged.

Spans: `render` fills a template's {SLOT}s and records where each slot landed; the operand slots, sorted in
text order, become "operand1" and "operand2" (and {OP} "operator"), shifted past the few-shot prefix.

Usage:
    >>> pairs = generate_mediation_pairs(MediationDataConfig(tasks=("addition", "retrieval")))
    >>> items, report = tokenize_mediation_pairs(tokenizer, pairs)      # mediation_tokens.py

Each template and intervention gets its own local RNG seeded by (seed, template id, intervention), so the same
config always gives the same pairs, and adding a template never changes another template's pairs.
"""

from __future__ import annotations

import logging
import random
import re
from typing import Any

from arithmech.data.generate import solve
from arithmech.data.mediation_prompts import (
    APPLICABLE,
    MediationDataConfig,
    MediationPair,
    Spans,
    load_facts,
    load_mediation_templates,
)
from arithmech.data.templates import OPERATIONS
from arithmech.errors import ConfigError

logger = logging.getLogger(__name__)
_SLOT = re.compile(r"\{(A|B|OP|NAME|X|Y|Q|S)\}")
_MAX_TRIES = 10_000


# -- rendering --------------------------------------------------------------------------------------------
def render(text: str, values: dict[str, str]) -> tuple[str, Spans]:
    """Fill the {SLOT}s of `text`; returns the text and the span of each slot's first occurrence."""
    out, spans, cursor, length = [], {}, 0, 0
    for match in _SLOT.finditer(text):
        literal = text[cursor : match.start()]
        value = values[match.group(1)]
        out += [literal, value]
        length += len(literal)
        spans.setdefault(match.group(1), (length, length + len(value)))
        length += len(value)
        cursor = match.end()
    out.append(text[cursor:])
    return "".join(out), spans


def _operand_spans(spans: Spans, offset: int, names: tuple[str, ...]) -> Spans:
    """Operand spans in text order as operand1, operand2 (+ operator), shifted by the prefix length."""
    ordered = sorted(spans[n] for n in names if n in spans)
    out = {f"operand{i + 1}": (s + offset, e + offset) for i, (s, e) in enumerate(ordered)}
    if "OP" in spans:
        out["operator"] = (spans["OP"][0] + offset, spans["OP"][1] + offset)
    return out


def _result(operation: str, a: int, b: int, cap: int | None) -> int | None:
    r = solve(operation, a, b)
    return r if r is not None and (cap is None or r <= cap) else None


# -- generation -------------------------------------------------------------------------------------------
def generate_mediation_pairs(
    cfg: MediationDataConfig, templates: dict[str, Any] | None = None, facts: list[dict[str, Any]] | None = None
) -> list[MediationPair]:
    """`cfg.n_per_template` pairs for every selected template (or fact relation and format) and type."""
    templates = load_mediation_templates() if templates is None else templates
    facts = load_facts() if facts is None else facts
    pairs: list[MediationPair] = []
    skipped: list[str] = []
    for task in cfg.tasks:
        for intervention in (i for i in cfg.interventions if i in APPLICABLE[task]):
            for tid, fmt, make in _sources(task, cfg, templates, facts):
                rng = random.Random(f"{cfg.seed}:{tid}:{intervention}")
                try:
                    made = [make(rng, intervention) for _ in range(cfg.n_per_template)]
                except ConfigError as err:  # e.g. "divided by" has no operator swap of the same length
                    skipped.append(str(err))
                    continue
                for base, alt, r, r2, spans, alt_spans, extra, prefix in made:
                    pairs.append(
                        MediationPair(prefix + base, prefix + alt, r, r2, task, intervention, fmt, tid,
                                      spans, alt_spans, extra)
                    )  # fmt: skip
    if skipped:
        logger.info("skipped %d template/type combinations: %s", len(skipped), "; ".join(skipped))
    if not pairs:
        raise ConfigError(
            f"no mediation pairs for tasks {cfg.tasks}, formats {cfg.formats} and interventions "
            f"{cfg.interventions}; retrieval has no operator type, facts only operands-and-result and "
            f"no equation format{': ' + skipped[0] if skipped else ''}"
        )
    logger.info("generated %d mediation pairs", len(pairs))
    return pairs


def _sources(task: str, cfg: MediationDataConfig, templates: dict[str, Any], facts: list[dict[str, Any]]) -> list:
    """(template id, format, maker) for each template of `task` in the chosen formats."""
    if task in OPERATIONS:
        chosen = [t for t in templates["arithmetic"] if t["format"] in cfg.formats and task in t["operators"]]
        return [(t["id"], t["format"], _ArithmeticMaker(t, task, cfg)) for t in chosen]
    if task == "retrieval":
        chosen = [t for t in templates["retrieval"] if t["format"] in cfg.formats]
        return [(t["id"], t["format"], _RetrievalMaker(t, templates, cfg)) for t in chosen]
    return [
        (f"fact-{rel['id']}-{fmt}", fmt, _FactMaker(rel, text, cfg))
        for rel in facts
        for fmt, text in rel["templates"].items()
        if fmt in cfg.formats
    ]


def _prefix(examples: list[tuple[str, str]]) -> str:
    return "".join(text + answer + "\n" for text, answer in examples)


class _ArithmeticMaker:
    def __init__(self, template: dict[str, Any], operation: str, cfg: MediationDataConfig) -> None:
        self.t, self.op, self.cfg = template, operation, cfg

    def _text(self, op: str, a: int, b: int) -> tuple[str, Spans]:
        return render(self.t["text"], {"A": str(a), "B": str(b), "OP": self.t["operators"][op]})

    def _draw(self, rng: random.Random, op: str, accept: Any = None) -> tuple[int, int, int] | None:
        lo, hi = self.cfg.operand_min, self.cfg.operand_max
        for _ in range(_MAX_TRIES):
            a, b = rng.randint(lo, hi), rng.randint(lo, hi)
            r = _result(op, a, b, self.cfg.result_max)
            if r is not None and (accept is None or accept(a, b, r)):
                return a, b, r
        return None

    def _alternative(self, rng: random.Random, kind: str, a: int, b: int, r: int) -> tuple | None:
        cap, lo, hi = self.cfg.result_max, self.cfg.operand_min, self.cfg.operand_max
        if kind == "operands-and-result":
            found = self._draw(rng, self.op, lambda _a, _b, r2: r2 != r)
            return (self.op, *found) if found else None
        if kind == "operands-same-result":
            options = [
                (x, y) for x in range(lo, hi + 1) for y in _partners(self.op, x, r, lo, hi) if (x, y) != (a, b)
            ] if hi - lo <= 1000 else []  # fmt: skip
            return (self.op, *rng.choice(options), r) if options else None
        words = len(self.t["operators"][self.op].split())
        ops = [
            o for o, sym in self.t["operators"].items()
            if o != self.op and len(sym.split()) == words and _result(o, a, b, cap) not in (None, r)
        ]  # fmt: skip
        if not ops:
            return None
        op2 = rng.choice(ops)
        return op2, a, b, _result(op2, a, b, cap)

    def __call__(self, rng: random.Random, kind: str) -> tuple:
        base = alt = None
        for _ in range(200):
            base = self._draw(rng, self.op)
            alt = self._alternative(rng, kind, *base) if base else None
            if base is None or alt is not None:
                break
        if base is None or alt is None:
            raise ConfigError(
                f"operands {self.cfg.operand_min}-{self.cfg.operand_max} (results <= {self.cfg.result_max}) "
                f"admit no {kind} pair for {self.op} in template {self.t['id']!r}; widen the ranges"
            )
        a, b, r = base
        op2, a2, b2, r2 = alt
        examples = []
        for _ in range(self.cfg.few_shot):
            x, y, z = self._draw(rng, self.op, lambda x, y, _z: (x, y) not in ((a, b), (a2, b2))) or base
            examples.append((self._text(self.op, x, y)[0], str(z)))
        prefix = _prefix(examples)
        (text, spans), (alt_text, alt_spans) = self._text(self.op, a, b), self._text(op2, a2, b2)
        extra = {"a": a, "b": b, "alt_a": a2, "alt_b": b2, "operation": self.op, "alt_operation": op2}
        names = ("A", "B")
        return (text, alt_text, str(r), str(r2), _operand_spans(spans, len(prefix), names),
                _operand_spans(alt_spans, len(prefix), names), extra, prefix)  # fmt: skip


def _partners(op: str, x: int, r: int, lo: int, hi: int) -> list[int]:
    """Every y in [lo, hi] with solve(op, x, y) == r."""
    if (op == "multiplication" and x == 0) or (op == "division" and r == 0):
        candidates = range(lo, hi + 1)  # 0 * y = 0 and 0 / y = 0 for every (non-zero) y
    elif op == "addition":
        candidates = [r - x]
    elif op == "subtraction":
        candidates = [x - r]
    else:  # multiplication y = r / x, division y = x / r, where exact
        num, den = (r, x) if op == "multiplication" else (x, r)
        candidates = [num // den] if den and num % den == 0 else []
    return [y for y in candidates if lo <= y <= hi and solve(op, x, y) == r]


class _RetrievalMaker:
    def __init__(self, template: dict[str, Any], data: dict[str, Any], cfg: MediationDataConfig) -> None:
        self.t, self.names, self.items, self.cfg = template, data["names"], data["items"], cfg
        if cfg.operand_max - cfg.operand_min < 2:
            raise ConfigError("number retrieval needs at least 3 distinct numbers; widen operand_min..operand_max")

    def _instance(self, rng: random.Random) -> tuple[dict[str, str], str]:
        x, y = rng.sample(rng.choice(self.items), 2)
        a, b = rng.sample(range(self.cfg.operand_min, self.cfg.operand_max + 1), 2)
        first = rng.random() < 0.5
        values = {"NAME": rng.choice(self.names), "X": x, "Y": y, "A": str(a), "B": str(b), "Q": x if first else y}
        return values, "A" if first else "B"

    def __call__(self, rng: random.Random, kind: str) -> tuple:
        values, asked = self._instance(rng)
        changed = asked if kind == "operands-and-result" else ("B" if asked == "A" else "A")
        taken = {values["A"], values["B"]}
        new = rng.choice([str(n) for n in range(self.cfg.operand_min, self.cfg.operand_max + 1) if str(n) not in taken])
        alt_values = {**values, changed: new}
        examples = []
        for _ in range(self.cfg.few_shot):
            ex, ex_asked = self._instance(rng)
            examples.append((render(self.t["text"], ex)[0], ex[ex_asked]))
        prefix = _prefix(examples)
        (text, spans), (alt_text, alt_spans) = render(self.t["text"], values), render(self.t["text"], alt_values)
        extra = {"asked": values["Q"], "changed": changed}
        return (text, alt_text, values[asked], alt_values[asked], _operand_spans(spans, len(prefix), ("A", "B")),
                _operand_spans(alt_spans, len(prefix), ("A", "B")), extra, prefix)  # fmt: skip


class _FactMaker:
    def __init__(self, relation: dict[str, Any], text: str, cfg: MediationDataConfig) -> None:
        self.rel, self.text, self.cfg = relation, text, cfg

    def __call__(self, rng: random.Random, kind: str) -> tuple:
        facts = self.rel["facts"]
        subject, answer = rng.choice(facts)
        alt_subject, alt_answer = rng.choice([f for f in facts if f[1] != answer])
        others = [f for f in facts if f[0] not in (subject, alt_subject)]
        shots = rng.sample(others, min(self.cfg.few_shot, len(others)))
        prefix = _prefix([(render(self.text, {"S": s})[0], a) for s, a in shots])
        (text, spans), (alt_text, alt_spans) = render(self.text, {"S": subject}), render(self.text, {"S": alt_subject})
        extra = {"relation": self.rel["id"], "subject": subject, "alt_subject": alt_subject}
        return (text, alt_text, answer, alt_answer, _operand_spans(spans, len(prefix), ("S",)),
                _operand_spans(alt_spans, len(prefix), ("S",)), extra, prefix)  # fmt: skip
