"""Prompt pairs for causal mediation analysis (Stolfo et al. 2023), and their tokenization.

A pair is a base prompt with result r and an alternative prompt of the same template with result r'. The
mediation engine (`patching/mediation.py`) runs the base prompt with one component's activation taken from
the alternative and reads how much probability moves from r to r'. Which part of the prompt differs is the
intervention type:

    operands-and-result   other operands, other result           "3 + 5 = " (8)  vs  "2 + 4 = " (6)
    operands-same-result  other operands, the same result        "3 + 5 = " (8)  vs  "6 + 2 = " (8)
    operator              same operands, other operation         "3 + 5 = " (8)  vs  "3 * 5 = " (15)

Tasks: the four operations in three formats (Q/A, statement, equation; `mediation_templates.json`), and two
comparison tasks that test whether a component is specific to arithmetic: number retrieval ("Paul has 3
apples and 5 pears. How many pears does Paul have?"; the alternative changes the number asked for, or for
operands-same-result the other number) and factual knowledge (`facts.json`; the alternative asks about
another subject of the same relation with a different answer; the subject plays operand 1). Not every type
fits every task: retrieval has no operator, facts only the subject swap; such combinations are skipped.

Choices (where Stolfo et al. are silent or their models differ):
- an optional few-shot prefix of solved examples of the same template (default 3: SmolLM2-135M is at chance
  zero-shot, METHODS.md sec. 1), identical in base and alternative, so only the final query differs; for the
  operator type the examples show the base operation;
- operands `operand_min..operand_max` (default single digits) and results capped by `result_max` (default 9,
  one token in digit-splitting tokenizers); subtraction only where A >= B, division only where exact;
- an operator swap only between operator words with the same number of words ("divided by" only swaps with
  itself), since base and alternative must have the same token length (mismatches are still rejected, and
  counted, when tokenizing).

Every pair carries the character spans of operand 1 and operand 2 (in text order) in both prompts; the
tokenizer's offset mapping turns them into position classes: early (before operand 1), operand1, middle,
operand2, late (after the last operand, before END) and last (END). Facts have no operand 2, so middle and
operand2 are empty and late starts after the subject.

Usage:
    >>> pairs = generate_mediation_pairs(MediationDataConfig(tasks=("addition", "retrieval")))
    >>> items, report = tokenize_mediation_pairs(tokenizer, pairs)

Each template and intervention gets its own local RNG seeded by (seed, template id, intervention), so the same
config always gives the same pairs, and adding a template never changes another template's pairs.
"""

from __future__ import annotations

import json
import logging
import random
import re
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from arithmech.data.generate import solve
from arithmech.data.templates import OPERATIONS
from arithmech.data.tokens import answer_target
from arithmech.errors import ConfigError, DataError

TASKS: tuple[str, ...] = (*OPERATIONS, "retrieval", "factual")
FORMATS: tuple[str, ...] = ("qa", "statement", "equation")
INTERVENTIONS: tuple[str, ...] = ("operands-and-result", "operands-same-result", "operator")
POSITION_CLASSES: tuple[str, ...] = ("early", "operand1", "middle", "operand2", "late", "last")
APPLICABLE = {
    **{op: INTERVENTIONS for op in OPERATIONS},
    "retrieval": ("operands-and-result", "operands-same-result"),
    "factual": ("operands-and-result",),
}
logger = logging.getLogger(__name__)
_SLOT = re.compile(r"\{(A|B|OP|NAME|X|Y|Q|S)\}")
_MAX_TRIES = 10_000
Spans = dict[str, tuple[int, int]]


@dataclass(frozen=True)
class MediationPair:
    """A base prompt and its alternative, with both results and the operand spans (characters, [start, end))."""

    base: str
    alternative: str
    base_result: str
    alt_result: str
    task: str
    intervention: str
    format: str
    template_id: str
    spans: Spans = field(default_factory=dict)
    """"operand1", "operand2" (absent for facts) and "operator" (arithmetic) in `base`."""
    alt_spans: Spans = field(default_factory=dict)
    """The same spans in `alternative`."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Operands, the alternative's operation and the like, for reading results back."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MediationPair:
        spans = {k: (int(v[0]), int(v[1])) for k, v in data.get("spans", {}).items()}
        alt_spans = {k: (int(v[0]), int(v[1])) for k, v in data.get("alt_spans", {}).items()}
        return cls(**{**data, "spans": spans, "alt_spans": alt_spans})


@dataclass(frozen=True)
class MediationDataConfig:
    """Which mediation pairs to generate; lists given for tuple fields become tuples."""

    tasks: tuple[str, ...] = field(default=("addition",), metadata={"help": f"tasks among {', '.join(TASKS)}"})
    formats: tuple[str, ...] = field(default=FORMATS, metadata={"help": "prompt formats: qa, statement, equation"})
    interventions: tuple[str, ...] = field(
        default=("operands-and-result",), metadata={"help": f"intervention types among {', '.join(INTERVENTIONS)}"}
    )
    n_per_template: int = field(default=8, metadata={"help": "pairs per template (or fact relation) and type"})
    operand_min: int = field(default=0, metadata={"help": "smallest operand / retrieved number (>= 0)"})
    operand_max: int = field(default=9, metadata={"help": "largest operand / retrieved number"})
    result_max: int | None = field(default=9, metadata={"help": "largest arithmetic result (None: no cap)"})
    few_shot: int = field(default=3, metadata={"help": "solved examples of the same template before the query"})
    seed: int = field(default=0, metadata={"help": "seed of the local random generators"})

    def __post_init__(self) -> None:
        for name, allowed in (("tasks", TASKS), ("formats", FORMATS), ("interventions", INTERVENTIONS)):
            value = getattr(self, name)
            if isinstance(value, list):  # YAML gives lists; keep the config hashable
                value = tuple(value)
                object.__setattr__(self, name, value)
            if not isinstance(value, tuple) or not value or any(v not in allowed for v in value):
                raise ConfigError(f"{name} must be a non-empty list drawn from {', '.join(allowed)}; got {value!r}")
        for name in ("n_per_template", "operand_min", "operand_max", "few_shot", "seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or (name != "seed" and value < 0):
                raise ConfigError(f"{name} must be a non-negative integer; got {value!r}")
        if self.n_per_template < 1 or self.operand_max < self.operand_min:
            raise ConfigError("set n_per_template >= 1 and operand_max >= operand_min")
        if self.result_max is not None and (not isinstance(self.result_max, int) or self.result_max < 0):
            raise ConfigError(f"result_max must be a non-negative integer or null; got {self.result_max!r}")


# -- data files -------------------------------------------------------------------------------------------
def _read_json(path: str | Path | None, name: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text() if path else resources.files("arithmech.data").joinpath(name).read_text()
        return json.loads(text)
    except (OSError, json.JSONDecodeError) as err:
        raise DataError(f"cannot read mediation data {path or name}: {err}; check the file") from None


def load_mediation_templates(path: str | Path | None = None) -> dict[str, Any]:
    """The arithmetic and retrieval templates, names and item pairs (`mediation_templates.json`)."""
    data = _read_json(path, "mediation_templates.json")
    for t in data.get("arithmetic", []):
        if t.get("format") not in FORMATS or set(t.get("operators", {})) - set(OPERATIONS):
            raise DataError(f"arithmetic template {t.get('id')!r} needs a format and operators by operation")
    return data


def load_facts(path: str | Path | None = None) -> list[dict[str, Any]]:
    """Fact relations: {"id", "templates": {format: text with {S}}, "facts": [[subject, answer], ...]}."""
    relations = _read_json(path, "facts.json").get("relations", [])
    for rel in relations:
        answers = {a for _, a in rel.get("facts", [])}
        if len(answers) < 2 or any("{S}" not in t for t in rel.get("templates", {}).values()):
            raise DataError(f"fact relation {rel.get('id')!r} needs {{S}} templates and two different answers")
    return relations


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


# -- tokenization -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenizedMediationPair:
    """One pair as token ids; base and alternative have the same length, END = the last position."""

    pair: MediationPair
    base_ids: torch.Tensor  # [pos] long
    alt_ids: torch.Tensor  # [pos] long
    result_id: int
    """First token of r after the base prompt."""
    alt_result_id: int
    """First token of r' after the alternative prompt."""
    position_class: torch.Tensor  # [pos] long, index into POSITION_CLASSES
    number_ids: tuple[int, ...] | None
    """First tokens of the numbers 0..max_number after the base prompt (None for non-numeric tasks)."""


@dataclass(frozen=True)
class MediationTokenReport:
    kept: int
    rejected_length_mismatch: int
    """Alternative prompt with another token length than the base prompt."""
    rejected_same_result_token: int
    """r and r' differ as text but start with the same token, for a type whose results must differ."""


def tokenize_mediation_pairs(
    tokenizer: Any, pairs: list[MediationPair], max_number: int | None = None
) -> tuple[list[TokenizedMediationPair], MediationTokenReport]:
    """Tokenize pairs (fast tokenizer: offsets give the position classes), rejecting and counting misfits.

    max_number: number tokens for the restricted accuracy are those of 0..max_number (None: max(9, the
    largest numeric result in `pairs`)).
    """
    if not getattr(tokenizer, "is_fast", False):
        raise DataError("mediation position classes need a fast tokenizer (offset mapping); load a fast one")
    numbers = [int(v) for p in pairs for v in (p.base_result, p.alt_result) if v.isdigit()]
    top = max([9, *numbers]) if max_number is None else max_number
    kept: list[TokenizedMediationPair] = []
    length = same = 0
    for pair in pairs:
        base, result_id = answer_target(tokenizer, pair.base, pair.base_result)
        alt, alt_result_id = answer_target(tokenizer, pair.alternative, pair.alt_result)
        enc = tokenizer(base, return_offsets_mapping=True)
        alt_ids = list(tokenizer(alt)["input_ids"])
        if len(alt_ids) != len(enc["input_ids"]):
            length += 1
            continue
        if result_id == alt_result_id and pair.base_result != pair.alt_result:
            same += 1
            continue
        numeric = pair.task != "factual"
        number_ids = (
            tuple(dict.fromkeys(answer_target(tokenizer, pair.base, str(n))[1] for n in range(top + 1)))
            if numeric else None
        )  # fmt: skip
        offsets = [(int(s), int(e)) for s, e in enc["offset_mapping"]]
        kept.append(
            TokenizedMediationPair(
                pair, torch.tensor(enc["input_ids"]), torch.tensor(alt_ids), result_id, alt_result_id,
                torch.tensor(position_classes(offsets, pair.spans)), number_ids,
            )
        )  # fmt: skip
    return kept, MediationTokenReport(len(kept), length, same)


def position_classes(offsets: list[tuple[int, int]], spans: Spans) -> list[int]:
    """Index into POSITION_CLASSES of each token, from its [start, end) characters and the operand spans.

    A token overlapping an operand's characters is that operand; the last token is always "last"; tokens
    before operand 1 are early, between the operands middle, after the last operand late.
    """
    o1, o2 = spans.get("operand1"), spans.get("operand2")
    out = []
    for i, (start, end) in enumerate(offsets):
        if i == len(offsets) - 1:
            name = "last"
        elif o1 is not None and start < o1[1] and end > o1[0]:
            name = "operand1"
        elif o2 is not None and start < o2[1] and end > o2[0]:
            name = "operand2"
        elif o1 is None or end <= o1[0]:
            name = "early"
        elif o2 is not None and end <= o2[0]:
            name = "middle"
        else:
            name = "late"
        out.append(POSITION_CLASSES.index(name))
    return out
