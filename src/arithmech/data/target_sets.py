"""Named prompt sets for transfer: the key components of one set, knocked out on another (paper sec. 5.1).

Background
    Zhang et al. (2024, section 5.1, Figure 4) knock out the heads identified on their addition data and
    show the model failing on other data: multi-digit integers, rational numbers and SVAMP word problems
    (a relative drop of -22.9% / 34.7% = -66% there). A transfer target is a named set of prompts that
    end where the answer's first token starts; the transfer stage scores that token at END.

Names (`target_set(name)`; `target_set_names()` lists them)
    <operation>                 e.g. "multiplication": every formation, single-digit operands and answer,
                                as identify generates them (templates.json, a few-shot prefix).
    <operation>-<formation>     e.g. "addition-qa": one formation only (a formation change).
    multidigit-<operation>      operands 10-99, any non-negative (exact) answer; target = its first token.
    decimals-<operation>        addition / subtraction of one-decimal operands (0.1-9.9, fraction not 0,
                                e.g. "1.5 + 2.7 = ") whose answer is below 10, written with one decimal
                                ("4.2", "4.0"); target = the first token, which for digit-splitting
                                tokenizers is the integer part, so a carry from the tenths must be done.
                                Counterfactual: the template's operator swap, as for integers.
                                Both also take a formation suffix: "multidigit-addition-qa".
    svamp, gsm8k                word problems (below); also any path to a JSONL file (.jsonl or .jsonl.gz)
                                with question and answer fields, e.g. "my/problems.jsonl".

Word problems
    Prompt = 3 solved examples, each "Question: ...\\nAnswer: <number>\\n\\n", then
    "Question: <q>\\nAnswer: "; the target is the first token of the answer. The examples are drawn once
    (seeded) and shared by every prompt of the set: from the train split where there is one (gsm8k), else
    from the same file's rows, which are then left out of the queries (svamp). The train split comes from
    where the test split came from (the test file's folder, or the hub), so the prompts do not depend on
    whether the machine happens to be online, nor mix a user's test file with another folder's train file.
    Examples are drawn among questions of at most 250 characters, to keep prompts short. Rows with a
    negative answer are skipped (their first token would be "-"). Word problems have no operator
    counterfactual: the pair's counterfactual is the reference itself, and the transfer stage ablates at END
    with the mean over the data set's own prompts (or zero / resample).

Data location (`resolve_word_problems`): a path is read as given. A known name ("svamp", "gsm8k") is looked
    up as `data/locate.py` says: `data_dir`, $ARITHMECH_DATA, then the copy shipped with arithmech (so it is
    always found); then the Hugging Face hub, only if the optional `datasets` package imports. Otherwise one
    DataError says where it looked, what the hub step did, and how to fix it.

Usage
    >>> spec = target_set("decimals-addition")
    >>> pairs = build_target_pairs(spec, TargetOptions(n_per_template=4, seed=0))
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arithmech.data.generate import GenerationConfig, Keep, generate_pairs
from arithmech.data.locate import (
    JSONL_SUFFIXES,
    find_data_file,
    hub_rows,
    is_jsonl_path,
    missing_data,
    read_data_text,
)
from arithmech.data.prompts import PromptPair
from arithmech.data.templates import FORMATIONS, OPERATIONS, Template, load_templates, select_templates
from arithmech.errors import ConfigError, DataError

WORD_PROBLEM_SETS: tuple[str, ...] = ("svamp", "gsm8k")
DECIMAL_OPERATIONS: tuple[str, ...] = ("addition", "subtraction")
_EXAMPLE_MAX_CHARS = 250
_ANSWER = re.compile(r"^\d+(\.\d+)?$")


@dataclass(frozen=True)
class TargetSpec:
    """What a named target set is; `build_target_pairs` turns it into prompt pairs."""

    name: str
    kind: str
    """"generated", "decimals" or "word"."""
    description: str
    operation: str | None = None
    formations: tuple[str, ...] = FORMATIONS
    operand_min: int = 0
    operand_max: int = 9
    single_digit_answer: bool = True
    source: str | None = None
    """Word problems: a known data set name or a JSONL path."""


@dataclass(frozen=True)
class TargetOptions:
    """How large a target set is and where its data come from."""

    n_per_template: int = field(default=8, metadata={"help": "prompt pairs per template (generated sets)"})
    few_shot: int = field(default=3, metadata={"help": "solved examples before each query"})
    limit: int = field(default=200, metadata={"help": "word-problem rows considered (seeded sample)"})
    seed: int = field(default=0, metadata={"help": "seed of generation and sampling"})
    data_dir: str | None = field(
        default=None, metadata={"help": "folder holding svamp/ and gsm8k/ (default $ARITHMECH_DATA, then shipped)"}
    )


_REGISTRY: dict[str, TargetSpec] = {}


def register_target_set(spec: TargetSpec) -> None:
    """Add a named target set; a name can be registered once."""
    if spec.name in _registry():
        raise ConfigError(f"target set {spec.name!r} is already registered; choose another name")
    _REGISTRY[spec.name] = spec


def target_set_names() -> list[str]:
    """Every registered name (a JSONL path is accepted too)."""
    return list(_registry())


def target_set(name: str) -> TargetSpec:
    """The spec of a registered name, or of a word-problem JSONL path."""
    registry = _registry()
    if name in registry:
        return registry[name]
    if is_jsonl_path(name):
        return TargetSpec(name, "word", f"word problems from {name}", source=name)
    raise ConfigError(
        f"unknown target set {name!r}; use <operation>[-<formation>], multidigit-<operation>[-<formation>], "
        f"decimals-addition/subtraction[-<formation>], {', '.join(WORD_PROBLEM_SETS)} or a .jsonl path"
    )


def _registry() -> dict[str, TargetSpec]:
    """The built-in names, registered on first use (no work at import)."""
    if _REGISTRY:
        return _REGISTRY
    specs = []
    for op in OPERATIONS:
        specs.append(TargetSpec(op, "generated", f"{op}, all formations, single digits", op))
        specs += [
            TargetSpec(f"{op}-{f}", "generated", f"{op}, {f} formation, single digits", op, (f,))
            for f in FORMATIONS
        ]
        for suffix, formations in (("", FORMATIONS), *((f"-{f}", (f,)) for f in FORMATIONS)):
            where = f", {formations[0]} formation" if suffix else ""
            specs.append(
                TargetSpec(f"multidigit-{op}{suffix}", "generated", f"{op}, operands 10-99{where}", op,
                           formations, operand_min=10, operand_max=99, single_digit_answer=False)
            )
            if op in DECIMAL_OPERATIONS:
                specs.append(TargetSpec(f"decimals-{op}{suffix}", "decimals",
                                        f"{op} of one-decimal operands, answer below 10{where}", op, formations))
    specs += [TargetSpec(name, "word", f"{name} word problems, few-shot", source=name) for name in WORD_PROBLEM_SETS]
    for spec in specs:
        if spec.name in _REGISTRY:
            raise ConfigError(f"built-in target set {spec.name!r} is defined twice")
        _REGISTRY[spec.name] = spec
    return _REGISTRY


def build_target_pairs(
    spec: TargetSpec, options: TargetOptions | None = None, keep: Keep | None = None, log: bool = True
) -> list[PromptPair]:
    """The prompt pairs of a target set; the same spec and options give the same list. `keep`: generated sets draw
    their queries among the problems it accepts (`generate_pairs`); the other kinds ignore it. `log=False`: no
    line about what was generated (`arithmech plan` only counts the pairs)."""
    options = options or TargetOptions()
    if spec.kind == "generated":
        cfg = GenerationConfig(
            operations=(spec.operation,) if spec.operation else OPERATIONS,
            formations=spec.formations,
            n_per_template=options.n_per_template,
            operand_min=spec.operand_min,
            operand_max=spec.operand_max,
            few_shot=options.few_shot,
            seed=options.seed,
            single_digit_answer=spec.single_digit_answer,
        )
        return generate_pairs(cfg, keep=keep, log=log)
    if spec.kind == "decimals":
        assert spec.operation is not None
        templates = select_templates(load_templates(), (spec.operation,), spec.formations)
        return decimal_pairs(templates, options.n_per_template, options.few_shot, options.seed)
    if spec.kind == "word":
        assert spec.source is not None
        return word_problem_pairs(spec.name, spec.source, options)
    raise ConfigError(f"target set {spec.name!r} has unknown kind {spec.kind!r}")


# --- decimals -------------------------------------------------------------------------------------------

def _tenths(value: int) -> str:
    """37 -> "3.7"."""
    return f"{value // 10}.{value % 10}"


def _decimal_problems(operation: str) -> list[tuple[int, int]]:
    """(A, B) in tenths, 0.1-9.9 with a non-zero tenth digit, answer in [0.1, 9.9] (sums may end in .0)."""
    if operation not in DECIMAL_OPERATIONS:
        raise ConfigError(f"decimals are generated for {' and '.join(DECIMAL_OPERATIONS)}, not {operation}")
    values = [v for v in range(1, 100) if v % 10]
    if operation == "addition":
        return [(a, b) for a in values for b in values if a + b < 100]
    return [(a, b) for a in values for b in values if a > b]


def _decimal_answer(operation: str, a: int, b: int) -> str:
    return _tenths(a + b if operation == "addition" else a - b)


def decimal_pairs(templates: list[Template], n_per_template: int, few_shot: int, seed: int) -> list[PromptPair]:
    """Like `generate_pairs`, with one-decimal operands: solved examples, query, operator-swap counterfactual."""
    pairs = []
    for template in templates:
        rng = random.Random(f"{seed}:decimals:{template.id}")
        pool = _decimal_problems(template.operation)
        for query in rng.sample(pool, n_per_template):
            others = [p for p in pool if p != query]
            examples = rng.sample(others, few_shot)
            pairs.append(_decimal_pair(template, query, examples))
    return pairs


def _decimal_pair(template: Template, query: tuple[int, int], examples: list[tuple[int, int]]) -> PromptPair:
    op = template.operation
    prefix = "".join(
        template.render(_tenths(a), _tenths(b)).text + _decimal_answer(op, a, b) + "\n" for a, b in examples
    )
    a, b = (_tenths(x) for x in query)
    ref = template.render(a, b)
    cf = template.render(a, b, counterfactual=True)
    spans = {name: (start + len(prefix), end + len(prefix)) for name, (start, end) in ref.spans.items()}
    spans["prefix"] = (0, len(prefix))
    return PromptPair(
        reference=prefix + ref.text, counterfactual=prefix + cf.text, answer=_decimal_answer(op, *query),
        template_id=template.id, operation=op, formation=template.formation, a=a, b=b, spans=spans,
        extra={"decimals": True},
    )


# --- word problems --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WordProblem:
    id: str
    question: str
    answer: str


def word_problem_pairs(name: str, source: str, options: TargetOptions) -> list[PromptPair]:
    """`options.limit` seeded test rows as 3-shot "Question: ...\\nAnswer: " prompts (see module docstring)."""
    test = resolve_word_problems(source, "test", options.data_dir)
    rows = [r for r in read_word_problems(test) if _ANSWER.match(r.answer)]
    rng = random.Random(f"{options.seed}:{name}")
    train = _train_split(source, test, options.data_dir)
    pool = train if train is not None else rows
    short = [r for r in pool if len(r.question) <= _EXAMPLE_MAX_CHARS and _ANSWER.match(r.answer)] or pool
    if len(short) < options.few_shot:
        raise DataError(f"{source} has {len(short)} rows to use as solved examples, fewer than {options.few_shot}")
    examples = rng.sample(short, options.few_shot)
    if train is None:
        taken = {r.id for r in examples}
        rows = [r for r in rows if r.id not in taken]
    queries = rng.sample(rows, min(options.limit, len(rows)))
    prefix = "".join(f"Question: {r.question}\nAnswer: {r.answer}\n\n" for r in examples)
    pairs = []
    for row in queries:
        prompt = f"{prefix}Question: {row.question}\nAnswer: "
        pairs.append(
            PromptPair(reference=prompt, counterfactual=prompt, answer=row.answer, template_id=name,
                       operation=None, formation="word", spans={"prefix": (0, len(prefix))},
                       extra={"id": row.id})
        )
    return sorted(pairs, key=lambda p: len(p.reference))  # similar lengths share a forward pass


def _train_split(source: str, test: Path | list[WordProblem], data_dir: str | None) -> list[WordProblem] | None:
    """The train rows of a known set from where its test rows came: the test file's folder, or the hub."""
    if source not in WORD_PROBLEM_SETS:
        return None
    if isinstance(test, Path):
        beside = [test.parent / f"train{suffix}" for suffix in JSONL_SUFFIXES]
        return next((read_word_problems(p) for p in beside if p.is_file()), None)
    try:
        return read_word_problems(resolve_word_problems(source, "train", data_dir))
    except DataError:
        return None


def resolve_word_problems(
    source: str | os.PathLike[str], split: str = "test", data_dir: str | os.PathLike[str] | None = None
) -> Path | list[WordProblem]:
    """The JSONL file of a known name or path, or the rows themselves when they came from the hub."""
    text = str(source)
    if text not in WORD_PROBLEM_SETS:
        path = Path(text)
        if not path.is_file():
            raise DataError(f"word-problem file {text} does not exist; pass a .jsonl (or .jsonl.gz) path or one "
                            f"of {', '.join(WORD_PROBLEM_SETS)}")
        return path
    found = find_data_file(f"{text}/{split}", data_dir)
    if found is not None:
        return found.path
    rows, why_not = _from_hub(text, split)
    if rows is not None:
        return rows
    raise missing_data(f"{text}/{split}", data_dir, why_not, "give a .jsonl path as the target set")


def read_word_problems(source: Path | list[WordProblem]) -> list[WordProblem]:
    """Rows {"id", "question", "answer"} of a JSONL file (.jsonl or .jsonl.gz; the shipped sets' schema)."""
    if isinstance(source, list):
        return source
    rows = []
    for number, line in enumerate(read_data_text(source).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            rows.append(WordProblem(str(row.get("id", f"row-{number}")), str(row["question"]).strip(),
                                    _canonical(row["answer"])))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{source} line {number} is not a JSON object with question and answer ({exc})") from exc
    if not rows:
        raise DataError(f"{source} has no rows; give one JSON object per line with question and answer")
    return rows


def _canonical(answer: Any) -> str:
    """18, "18", "18.0", "1,000" -> "18" / "1000"; "9.43" stays."""
    text = str(answer).replace(",", "").strip()
    value = float(text)
    return str(int(value)) if value == int(value) else text


_HUB = {"gsm8k": ("openai/gsm8k", "main"), "svamp": ("ChilleD/SVAMP", None)}


def _from_hub(name: str, split: str) -> tuple[list[WordProblem] | None, str]:
    """(rows, "") from the Hugging Face hub, or (None, why not): `datasets` missing, offline, no such split."""
    repo, config = _HUB[name]
    rows, why_not = hub_rows(repo, config, split)
    if rows is None:
        return None, why_not
    return [WordProblem(str(r["id"]), str(r["question"]).strip(), _canonical(r["answer"])) for r in rows], ""
