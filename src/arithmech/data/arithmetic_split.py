"""A leakage-free train / validation / test split of the arithmetic prompts: by template family and by fact.

Background
    Fine-tuning on arithmetic prompts and testing on more of the same measures memorisation unless every test
    prompt is new twice over: a phrasing the training never used and a problem it never solved. So, once and
    seeded, the templates of every (operation, formation) are split into train and test templates, and every
    operation's problems into train, validation and test problems (40% and 20% held out by default).
    - Templates go whole families at a time (templates.json `family`): near-copies such as "{A}-{B} = " and
      "{A} - {B} = ", or "Q: How much is {A} minus {B}? A: " and "Q: What is {A} minus {B}? A: ", are one family
      (texts equal once whitespace is removed, a leading "Calculate:" dropped and "How much is" read as "What is").
      Of the family sets that leave one for training, one (seeded) with a template count closest to
      `test_templates_per_group` (2 of the 4) is held out, so the equation formation, whose four templates are a
      family of three and one, holds out one or three.
    - Problems go whole facts at a time (data/facts.py): a pair and its swap (3 + 5, 5 + 3; 2 * 4, 4 * 2) and a
      problem and its inverse (7 - 2 = 5 and 7 - 5 = 2; 8 / 2 and 8 / 4) are always in one part. Each operation is
      split on its own, so 5 - 3 may be a test problem while 5 + 3 (another fact) is trained. Across operations
      one fact joins addition and subtraction (2 + 3 = 5 is 5 - 3 = 2), and multiplication and division; those
      links chain the whole grid, so they are not held out but counted (`related_fact_trained`, in split.json).
    Zhang et al. (2024) fine-tune on word problems and do not split arithmetic prompts; this split is ours.

Parts (`split_prompts`; every prompt is `few_shot` solved examples of its own template, then the query)
    train       train templates x train pairs; solved examples: train pairs of other facts.
    validation  train templates x validation pairs (new problems in known phrasings), for choosing
                hyperparameters such as the learning rate; solved examples: train pairs.
    test        test templates x test pairs (new problems in new phrasings); solved examples: train pairs.
    transfer    (`transfer_prompts`) test templates with operands 10-99, all above the train range: held-out
                multi-digit operands (and answers); solved examples: other multi-digit problems.
    Queries keep the project's default rule (data/generate.py): a single-digit answer, subtraction only where
    A >= B, division only where exact. A part lists every (template, query pair) once, in a seeded order;
    asking for n prompts cycles through that list, drawing new solved examples on every pass.

Invariants (tests/unit/data/test_arithmetic_split.py, over seeds)
    - no test template shares a family with a train template, and train and validation prompts use train
      templates only;
    - every problem in a train prompt, query or solved example, is a train problem of its operation, and no test
      or validation problem's swap or inverse is one;
    - a test problem appears only as the query of a test prompt: it is no prompt's solved example, so its answer
      is written in no prompt of its operation; likewise a validation problem appears only as a validation query.

Recorded: `ArithmeticSplit.record()` is what split.json holds in the finetune and evaluate folders (parameters,
template ids, problems, per-operation counts, test problems whose fact another operation trains, and a
fingerprint, so two folders can be checked to share one split).

Usage
    >>> split = make_split(seed=0)
    >>> train = split_prompts(split, "train", ("subtraction",), n=256)
    >>> test = split_prompts(split, "test", ("subtraction",))
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from dataclasses import asdict, dataclass, replace
from typing import Any

from arithmech.data.facts import Fact, fact_of, related_counts
from arithmech.data.generate import GenerationConfig, build_pair, generate_pairs, solve
from arithmech.data.prompts import PromptPair
from arithmech.data.templates import FORMATIONS, OPERATIONS, Template, load_templates, select_templates
from arithmech.errors import ConfigError

PARTS: tuple[str, ...] = ("train", "validation", "test")
DEFAULT_SHOTS = 3
TRANSFER_MIN, TRANSFER_MAX = 10, 99
TRANSFER_PER_TEMPLATE = 16

Problem = tuple[int, int]


@dataclass(frozen=True)
class ArithmeticSplit:
    """Which templates and operand pairs belong to which part (see the module docstring)."""

    seed: int
    test_templates_per_group: int
    test_fraction: float
    validation_fraction: float
    operand_min: int
    operand_max: int
    train_templates: tuple[str, ...]
    test_templates: tuple[str, ...]
    pairs: dict[str, dict[str, tuple[Problem, ...]]]
    """operation -> "train", "validation", "test" -> its problems (A, B), sorted."""

    def templates_of(self, part: str) -> tuple[str, ...]:
        return self.test_templates if part == "test" else self.train_templates

    def record(self) -> dict[str, Any]:
        """What split.json holds: every field, per-operation counts, cross-operation facts, and the fingerprint."""
        fields = {**asdict(self), "train_templates": list(self.train_templates),
                  "test_templates": list(self.test_templates),
                  "pairs": {op: {part: [list(p) for p in pairs] for part, pairs in parts.items()}
                            for op, parts in self.pairs.items()}}  # fmt: skip
        counts = {op: {part: len(self.valid_pairs(part, op)) for part in PARTS} for op in OPERATIONS}
        return {**fields, "queries_per_operation": counts, "related_fact_trained": self.related_fact_trained(),
                "fingerprint": self.fingerprint}  # fmt: skip

    def related_fact_trained(self, trained: tuple[str, ...] = OPERATIONS) -> dict[str, dict[str, int]]:
        """Per operation: its test problems whose fact (data/facts.py) is a train problem of another operation
        among `trained` (2 + 3 = 5 tested, 5 - 3 = 2 trained); within an operation there are none by design."""
        return related_counts({op: self.pairs[op]["test"] for op in OPERATIONS},
                              {op: self.pairs[op]["train"] for op in trained})  # fmt: skip

    @property
    def fingerprint(self) -> str:
        pairs = {op: {k: list(v) for k, v in parts.items()} for op, parts in self.pairs.items()}
        payload = json.dumps({**asdict(self), "pairs": pairs}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def valid_pairs(self, part: str, operation: str) -> list[Problem]:
        """The part's problems of `operation` (valid single-digit-answer problems only)."""
        return list(self.pairs[operation][part])


def _single_digit(operation: str, a: int, b: int) -> bool:
    answer = solve(operation, a, b)
    return answer is not None and answer <= 9


def make_split(
    seed: int = 0,
    test_templates_per_group: int = 2,
    test_fraction: float = 0.4,
    validation_fraction: float = 0.2,
    operand_min: int = 0,
    operand_max: int = 9,
    templates: list[Template] | None = None,
) -> ArithmeticSplit:
    """Split the template families of every (operation, formation) and every operation's facts, seeded locally."""
    if not 0 < test_fraction < 1 or not 0 <= validation_fraction < 1 or test_fraction + validation_fraction >= 1:
        raise ConfigError(f"test_fraction ({test_fraction}) and validation_fraction ({validation_fraction}) must be "
                          "shares of the operand grid that leave some pairs for training")  # fmt: skip
    if not 0 <= operand_min <= operand_max < TRANSFER_MIN:
        raise ConfigError(f"the split's operands must lie in 0-{TRANSFER_MIN - 1} (got {operand_min}-{operand_max}), "
                          "below the multi-digit transfer set's")  # fmt: skip
    templates = load_templates() if templates is None else templates
    train, test = [], []
    for op in OPERATIONS:
        for formation in FORMATIONS:
            group = select_templates(templates, (op,), (formation,))
            if not group:
                continue
            if not 0 < test_templates_per_group < len(group):
                raise ConfigError(f"{op} / {formation} has {len(group)} templates; hold out 1 to {len(group) - 1} of "
                                  f"them, not {test_templates_per_group}")  # fmt: skip
            rng = random.Random(f"{seed}:templates:{op}:{formation}")
            held = _held_out_families(group, test_templates_per_group, rng)
            test += [t.id for t in group if t.family_id in held]
            train += [t.id for t in group if t.family_id not in held]
    grid = [(a, b) for a in range(operand_min, operand_max + 1) for b in range(operand_min, operand_max + 1)]
    pairs = {op: _split_facts([p for p in grid if _single_digit(op, *p)], op, test_fraction, validation_fraction,
                              random.Random(f"{seed}:facts:{op}")) for op in OPERATIONS}  # fmt: skip
    return ArithmeticSplit(
        seed=seed, test_templates_per_group=test_templates_per_group, test_fraction=test_fraction,
        validation_fraction=validation_fraction, operand_min=operand_min, operand_max=operand_max,
        train_templates=tuple(sorted(train)), test_templates=tuple(sorted(test)), pairs=pairs,
    )  # fmt: skip


def _held_out_families(group: list[Template], target: int, rng: random.Random) -> set[str]:
    """Whole families of near-copies to hold out: of the sets that leave a family for training, one (seeded) of
    those whose template count is closest to `target`."""
    sizes: dict[str, int] = {}
    for t in group:
        sizes[t.family_id] = sizes.get(t.family_id, 0) + 1
    families = sorted(sizes)
    if len(families) < 2:
        raise ConfigError(f"the {group[0].operation} / {group[0].formation} templates are all one family "
                          f"({families[0]}), so none can be held out as a new phrasing; add a template of "
                          "another family or split the family in the templates file")  # fmt: skip
    choices = [set(c) for r in range(1, len(families)) for c in itertools.combinations(families, r)]
    gap = min(abs(sum(sizes[f] for f in c) - target) for c in choices)
    return rng.choice([c for c in choices if abs(sum(sizes[f] for f in c) - target) == gap])


def _split_facts(
    problems: list[Problem], operation: str, test_fraction: float, validation_fraction: float, rng: random.Random
) -> dict[str, tuple[Problem, ...]]:
    """One operation's problems in parts, whole facts at a time (a pair and its swap, a problem and its inverse):
    facts in seeded order fill test, then validation, up to their shares (overshooting by at most one problem)."""
    by_fact: dict[Fact, list[Problem]] = {}
    for p in problems:
        by_fact.setdefault(fact_of(operation, *p), []).append(p)
    facts = sorted(by_fact)
    rng.shuffle(facts)
    wanted = {"test": round(test_fraction * len(problems)), "validation": round(validation_fraction * len(problems))}
    parts: dict[str, list[Problem]] = {part: [] for part in PARTS}
    for fact in facts:
        part = next((p for p in ("test", "validation") if len(parts[p]) < wanted[p]), "train")
        parts[part] += by_fact[fact]
    return {part: tuple(sorted(parts[part])) for part in PARTS}


def _part_templates(split: ArithmeticSplit, part: str, operations: tuple[str, ...]) -> list[Template]:
    if part not in PARTS:
        raise ConfigError(f"split part {part!r} is not one of {', '.join(PARTS)}")
    bad = [op for op in operations if op not in OPERATIONS]
    if bad or not operations:
        raise ConfigError(f"operations must be drawn from {', '.join(OPERATIONS)}; got {', '.join(operations)}")
    chosen = select_templates(load_templates(), operations, None, split.templates_of(part))
    if not chosen:
        raise ConfigError(f"the {part} templates of the split include none of {', '.join(operations)}")
    return chosen


def split_prompts(
    split: ArithmeticSplit,
    part: str,
    operations: tuple[str, ...] = OPERATIONS,
    n: int | None = None,
    few_shot: int = DEFAULT_SHOTS,
    seed: int = 0,
) -> list[PromptPair]:
    """The prompts of one part for `operations`: each (template, query pair) once, or `n` prompts cycling over them.

    Solved examples are `few_shot` train pairs of other facts than the query's, drawn per prompt by a local RNG
    seeded by (split seed, seed, part, template, query, pass), so a prompt never depends on which others are
    generated.
    """
    items: list[tuple[Template, Problem]] = []
    for template in _part_templates(split, part, operations):
        queries = split.valid_pairs(part, template.operation)
        examples = split.valid_pairs("train", template.operation)
        if not queries or len(examples) < few_shot + 2 * (part == "train"):
            raise ConfigError(
                f"the split leaves {template.operation} {len(queries)} {part} and {len(examples)} train problems, too "
                f"few for {few_shot} solved examples; widen the operand range or lower the held-out fractions"
            )
        items += [(template, q) for q in queries]
    random.Random(f"{split.seed}:{seed}:{part}:order").shuffle(items)
    count = len(items) if n is None else n
    prompts = []
    for i in range(count):
        template, query = items[i % len(items)]
        rng = random.Random(f"{split.seed}:{seed}:{part}:{template.id}:{query}:{i // len(items)}")
        fact = fact_of(template.operation, *query)
        others = [p for p in split.valid_pairs("train", template.operation) if fact_of(template.operation, *p) != fact]
        shots = rng.sample(others, few_shot)
        pair = build_pair(template, query, shots)
        prompts.append(_tagged(pair, part, shots))
    return prompts


def transfer_prompts(
    split: ArithmeticSplit,
    operations: tuple[str, ...] = OPERATIONS,
    n_per_template: int = TRANSFER_PER_TEMPLATE,
    few_shot: int = DEFAULT_SHOTS,
    seed: int = 0,
) -> list[PromptPair]:
    """Held-out multi-digit operands (10-99, any valid answer) on the test templates (see the module docstring)."""
    ids = tuple(t.id for t in _part_templates(split, "test", operations))
    cfg = GenerationConfig(operations=operations, template_ids=ids, n_per_template=n_per_template,
                           operand_min=TRANSFER_MIN, operand_max=TRANSFER_MAX, few_shot=few_shot,
                           seed=seed * 1_000_003 + split.seed, single_digit_answer=False)  # fmt: skip
    return [_tagged(p, "transfer", None) for p in generate_pairs(cfg)]


def _tagged(pair: PromptPair, part: str, shots: list[Problem] | None) -> PromptPair:
    """The pair with its part (and its solved examples' operands) in `extra`."""
    extra = {"part": part, **({"examples": [list(s) for s in shots]} if shots is not None else {})}
    return replace(pair, extra=extra)
