"""A leakage-free train / validation / test split of the arithmetic prompts: by template and by operand pair.

Background
    Fine-tuning on arithmetic prompts and testing on more of the same measures memorisation unless every test
    prompt is new twice over: a phrasing the training never used and a problem it never solved. So, once and
    seeded, the templates of every (operation, formation) are split into train and test templates (templates.json
    has 4 per group; 2 are held out by default), and the operand grid (A, B) in [operand_min, operand_max]^2 into
    train, validation and test pairs (40% and 20% held out by default, in proportion within each group of pairs
    that make a problem of the same operations). The pair split is one split of the grid, shared by every
    operation: a test pair (7, 3) is tested as 7 - 3 and as 7 + 3 and is trained on in no operation. Zhang et al.
    (2024) fine-tune on word problems and do not split arithmetic prompts; this split is ours (issue #14).

Parts (`split_prompts`; every prompt is `few_shot` solved examples of its own template, then the query)
    train       train templates x train pairs; solved examples: other train pairs.
    validation  train templates x validation pairs (new problems in known phrasings), for choosing
                hyperparameters such as the learning rate; solved examples: train pairs.
    test        test templates x test pairs (new problems in new phrasings); solved examples: train pairs.
    transfer    (`transfer_prompts`) test templates with operands 10-99, all above the train range: held-out
                multi-digit operands (and answers); solved examples: other multi-digit problems.
    Queries keep the project's default rule (data/generate.py): a single-digit answer, subtraction only where
    A >= B, division only where exact. A part lists every (template, query pair) once, in a seeded order;
    asking for n prompts cycles through that list, drawing new solved examples on every pass.

Invariants (tests/unit/data/test_arithmetic_split.py, over seeds)
    - no test template is a train template, and train and validation prompts use train templates only;
    - every pair in a train prompt, query or solved example, is a train pair;
    - a test pair appears only as the query of a test prompt: it is no prompt's solved example, so its answer is
      written in no prompt at all; likewise a validation pair appears only as a validation query.

Recorded: `ArithmeticSplit.record()` is what split.json holds in the finetune and evaluate folders (parameters,
template ids, pairs, per-operation counts and a fingerprint, so two folders can be checked to share one split).

Usage
    >>> split = make_split(seed=0)
    >>> train = split_prompts(split, "train", ("subtraction",), n=256)
    >>> test = split_prompts(split, "test", ("subtraction",))
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, replace
from typing import Any

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
    pairs: dict[str, tuple[Problem, ...]]
    """"train", "validation", "test" -> operand pairs (A, B), sorted."""

    def templates_of(self, part: str) -> tuple[str, ...]:
        return self.test_templates if part == "test" else self.train_templates

    def record(self) -> dict[str, Any]:
        """What split.json holds: every field, per-operation counts of valid query pairs, and the fingerprint."""
        fields = {**asdict(self), "train_templates": list(self.train_templates),
                  "test_templates": list(self.test_templates),
                  "pairs": {part: [list(p) for p in pairs] for part, pairs in self.pairs.items()}}  # fmt: skip
        counts = {op: {part: len(self.valid_pairs(part, op)) for part in PARTS} for op in OPERATIONS}
        return {**fields, "queries_per_operation": counts, "fingerprint": self.fingerprint}

    @property
    def fingerprint(self) -> str:
        payload = json.dumps({**asdict(self), "pairs": {k: list(v) for k, v in self.pairs.items()}}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def valid_pairs(self, part: str, operation: str) -> list[Problem]:
        """The part's pairs that make a valid single-digit-answer problem of `operation`."""
        return [(a, b) for a, b in self.pairs[part] if _single_digit(operation, a, b)]


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
    """Split the templates of every (operation, formation) and the operand grid, with local seeded RNGs."""
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
            ids = sorted(t.id for t in select_templates(templates, (op,), (formation,)))
            if not ids:
                continue
            if not 0 < test_templates_per_group < len(ids):
                raise ConfigError(f"{op} / {formation} has {len(ids)} templates; hold out 1 to {len(ids) - 1} of "
                                  f"them, not {test_templates_per_group}")  # fmt: skip
            random.Random(f"{seed}:templates:{op}:{formation}").shuffle(ids)
            test += ids[:test_templates_per_group]
            train += ids[test_templates_per_group:]
    strata: dict[tuple[str, ...], list[Problem]] = {}  # pairs by the operations they are a problem of
    for a in range(operand_min, operand_max + 1):
        for b in range(operand_min, operand_max + 1):
            strata.setdefault(tuple(op for op in OPERATIONS if _single_digit(op, a, b)), []).append((a, b))
    pairs: dict[str, list[Problem]] = {part: [] for part in PARTS}
    rng = random.Random(f"{seed}:pairs")
    for _, group in sorted(strata.items()):
        rng.shuffle(group)
        n_test, n_val = round(test_fraction * len(group)), round(validation_fraction * len(group))
        pairs["test"] += group[:n_test]
        pairs["validation"] += group[n_test : n_test + n_val]
        pairs["train"] += group[n_test + n_val :]
    return ArithmeticSplit(
        seed=seed, test_templates_per_group=test_templates_per_group, test_fraction=test_fraction,
        validation_fraction=validation_fraction, operand_min=operand_min, operand_max=operand_max,
        train_templates=tuple(sorted(train)), test_templates=tuple(sorted(test)),
        pairs={part: tuple(sorted(pairs[part])) for part in PARTS},
    )  # fmt: skip


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

    Solved examples are `few_shot` train pairs other than the query, drawn per prompt by a local RNG seeded by
    (split seed, seed, part, template, query, pass), so a prompt never depends on which others are generated.
    """
    items: list[tuple[Template, Problem]] = []
    for template in _part_templates(split, part, operations):
        queries = split.valid_pairs(part, template.operation)
        examples = split.valid_pairs("train", template.operation)
        if not queries or len(examples) < few_shot + (part == "train"):
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
        others = [p for p in split.valid_pairs("train", template.operation) if p != query]
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
