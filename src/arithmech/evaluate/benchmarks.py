"""The benchmarks of Zhang et al. (2024, Table 1) as a registry: data, kind, prompt format, few-shot exemplars.

Kinds
    generate   the model writes a solution by greedy decoding; the final number is read (`answers.py`) and
               matched numerically. GSM8K, SVAMP, AddSub, SingleEq (full test sets), the llm_adapters_math_v1
               test rows of one source ("adapters-gsm8k", ...), or a user's JSONL of math rows.
    choice     each option is scored by the log-likelihood of its continuation (`choice.py`); the most likely
               is the prediction. MMLU, CommonsenseQA, or a user's JSONL with "choices".
    general    perplexity of the model (and KL to a base model) on plain text (`general.py`).
    arithmetic the project's own templates on the leakage-free split (data/arithmetic_split.py): held-out
               templates x held-out operand pairs, few-shot; first answer token and exact number scored in one
               teacher-forced pass (`arithmetic.py`). "arithmetic" asks all four operations,
               "arithmetic-<operation>" one; "arithmetic-multidigit[-<operation>]" the held-out multi-digit
               operands (10-99) on the same test templates.

Prompt formats (`build_prompts`)
    cot     Wei et al. (2022) chain of thought. Solved examples "Q: ...\\nA: <reasoning> The answer is N.\\n\\n",
            then "Q: <question>\\nA:". The examples are the 8 classic exemplars of Wei et al. (Table 20),
            written out below (`COT_EXEMPLARS`); their first n_shot are used (default 8). Wei et al. used
            these same 8 for GSM8K, SVAMP, ASDiv and MAWPS (of which AddSub and SingleEq are parts), and
            LLM-Adapters-style evaluations (Hu et al. 2023) use the same "The answer is" convention, so every
            math benchmark shares them. They were written for the CoT paper and are in none of the local
            test sets (checked: no question matches). Generation stops at a blank line or a new "Q:" /
            "Question:" turn.
    mmlu    Hendrycks et al. (2021) 5-shot: "The following are multiple choice questions (with answers) about
            <subject>.\\n\\n", then the 5 dev rows of the same subject and the question. Letter format
            (default, the original MMLU scoring): options listed "A. ...", "Answer: B", and the continuations
            " A" ... " D" are scored. Text format (cloze; small models are at chance on letters): no list,
            "Answer: <option text>", and each option's text is scored.
    qa      CommonsenseQA, zero-shot (its training split is not shipped): "Question: <q>\\nAnswer:".
            Text format (default): each option's text is scored (acc, and acc_norm = per-character
            log-likelihood as in lm-evaluation-harness). Letter format: options listed A-E, letters scored.
            A user's choice JSONL uses the same format.

Chat template (option, default off)
    The defaults are base-model few-shot prompts, which is how Zhang et al. and lm-evaluation-harness score
    MMLU and GSM8K. With chat_template on, the whole prompt (examples included, without its trailing
    "A:" / "Answer:") becomes one user message, the tokenizer's chat template adds the assistant turn, and the
    continuation is the assistant's text: generation stops at the model's end-of-turn token or a new "Q:"
    turn (not at a blank line), and scored choices lose their leading space.

Usage
    >>> bench = benchmark("gsm8k")
    >>> prompts = build_prompts(bench, items, n_shot=8)
    >>> prompts[0].text.endswith("\\nA:")
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arithmech.data.arithmetic_split import DEFAULT_SHOTS
from arithmech.data.locate import is_jsonl_path
from arithmech.data.templates import OPERATIONS
from arithmech.errors import ConfigError
from arithmech.evaluate.answers import choice_letter
from arithmech.evaluate.loading import EvalItem

KINDS = ("generate", "choice", "general", "arithmetic")
CHOICE_FORMATS = ("letter", "text")
GENERAL = "general"
STOP_STRINGS = ("\n\n", "\nQ:", "Question:")
CHAT_STOP_STRINGS = ("\nQ:", "Question:")

# Wei et al. 2022, "Chain-of-thought prompting elicits reasoning in large language models", Table 20.
COT_EXEMPLARS: tuple[tuple[str, str, str], ...] = (
    ("There are 15 trees in the grove. Grove workers will plant trees in the grove today. After they are done, "
     "there will be 21 trees. How many trees did the grove workers plant today?",
     "There are 15 trees originally. Then there were 21 trees after some more were planted. So there must have "
     "been 21 - 15 = 6.", "6"),
    ("If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in the parking lot?",
     "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5.", "5"),
    ("Leah had 32 chocolates and her sister had 42. If they ate 35, how many pieces do they have left in total?",
     "Originally, Leah had 32 chocolates. Her sister had 42. So in total they had 32 + 42 = 74. After eating 35, "
     "they had 74 - 35 = 39.", "39"),
    ("Jason had 20 lollipops. He gave Denny some lollipops. Now Jason has 12 lollipops. How many lollipops did "
     "Jason give to Denny?",
     "Jason started with 20 lollipops. Then he had 12 after giving some to Denny. So he gave Denny 20 - 12 = 8.",
     "8"),
    ("Shawn has five toys. For Christmas, he got two toys each from his mom and dad. How many toys does he have "
     "now?",
     "Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is 4 more toys. "
     "5 + 4 = 9.", "9"),
    ("There were nine computers in the server room. Five more computers were installed each day, from monday to "
     "thursday. How many computers are now in the server room?",
     "There were originally 9 computers. For each of 4 days, 5 more computers were added. So 5 * 4 = 20 "
     "computers were added. 9 + 20 is 29.", "29"),
    ("Michael had 58 golf balls. On tuesday, he lost 23 golf balls. On wednesday, he lost 2 more. How many golf "
     "balls did he have at the end of wednesday?",
     "Michael started with 58 golf balls. After losing 23 on tuesday, he had 58 - 23 = 35. After losing 2 more, "
     "he had 35 - 2 = 33 golf balls.", "33"),
    ("Olivia has $23. She bought five bagels for $3 each. How much money does she have left?",
     "Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. So she has 23 - 15 dollars "
     "left. 23 - 15 is 8.", "8"),
)


@dataclass(frozen=True)
class Benchmark:
    """A named benchmark: what it is, where its rows are, and how it is prompted and scored."""

    name: str
    kind: str
    description: str
    data: str | None = None
    """"<folder>/<split>" under a data root, or a .jsonl path."""
    style: str = "cot"
    """Prompt format: cot, mmlu or qa."""
    n_shot: int = 0
    """Default number of solved examples."""
    max_shot: int = 0
    choice_format: str = "text"
    exemplars: str | None = None
    """Where few-shot rows come from (mmlu: "mmlu/dev", matched by subject)."""
    source: str | None = None
    """llm_adapters_math_v1 rows: keep this `source` only."""
    hub: tuple[str, str | None, str] | None = None
    """(repo, config, split) on the Hugging Face hub, used when no local file is found."""
    exemplar_hub: tuple[str, str | None, str] | None = None
    operations: tuple[str, ...] = ()
    """arithmetic: the operations asked."""
    arithmetic: str | None = None
    """arithmetic: "split" (its test or validation part) or "multidigit" (the transfer set)."""


@dataclass(frozen=True)
class Prompt:
    """A prompt ready to run: the context text and, for choice benchmarks, the continuation of each option."""

    item: EvalItem
    text: str
    continuations: tuple[str, ...] = ()


_REGISTRY: dict[str, Benchmark] = {}


def register_benchmark(bench: Benchmark) -> None:
    """Add a benchmark; a name can be registered once."""
    if bench.name in _registry():
        raise ConfigError(f"benchmark {bench.name!r} is already registered; choose another name")
    if bench.kind not in KINDS:
        raise ConfigError(f"benchmark kind {bench.kind!r} is not one of {', '.join(KINDS)}")
    _REGISTRY[bench.name] = bench


def benchmark_names() -> list[str]:
    """Every registered name (a .jsonl path is accepted too)."""
    return list(_registry())


def benchmark(name: str, rows_hint: list[dict[str, Any]] | None = None) -> Benchmark:
    """The registered benchmark of a name, or one made for a user's .jsonl(.gz) file (choice if rows have choices)."""
    registry = _registry()
    if name in registry:
        return registry[name]
    if is_jsonl_path(name):
        is_choice = bool(rows_hint) and "choices" in rows_hint[0]
        if is_choice:
            return Benchmark(name, "choice", f"choice questions from {name}", data=name, style="qa")
        return Benchmark(name, "generate", f"math word problems from {name}", data=name, n_shot=8, max_shot=8)
    raise ConfigError(f"unknown benchmark {name!r}; use one of {', '.join(registry)} or a .jsonl path")


def _registry() -> dict[str, Benchmark]:
    """The built-in benchmarks, registered on first use (no work at import)."""
    if _REGISTRY:
        return _REGISTRY
    n = len(COT_EXEMPLARS)
    builtins = [
        Benchmark("gsm8k", "generate", "GSM8K test, 8-shot chain of thought", "gsm8k/test", n_shot=n, max_shot=n,
                  hub=("openai/gsm8k", "main", "test")),
        Benchmark("svamp", "generate", "SVAMP, 8-shot chain of thought", "svamp/test", n_shot=n, max_shot=n,
                  hub=("ChilleD/SVAMP", None, "test")),
        Benchmark("addsub", "generate", "AddSub, 8-shot chain of thought", "addsub/test", n_shot=n, max_shot=n),
        Benchmark("singleeq", "generate", "SingleEq, 8-shot chain of thought", "singleeq/test", n_shot=n,
                  max_shot=n),
        *(Benchmark(f"adapters-{key}", "generate", f"llm_adapters_math_v1 test rows from {source}, 8-shot CoT",
                    "llm_adapters_math_v1/test", n_shot=n, max_shot=n, source=source)
          for key, source in (("gsm8k", "gsm8k"), ("svamp", "SVAMP"), ("addsub", "AddSub"),
                              ("singleeq", "SingleEq"), ("multiarith", "MultiArith"))),
        Benchmark("mmlu", "choice", "MMLU test, 5-shot from dev of the same subject, letters scored", "mmlu/test",
                  style="mmlu", n_shot=5, max_shot=5, choice_format="letter", exemplars="mmlu/dev",
                  hub=("cais/mmlu", "all", "test"), exemplar_hub=("cais/mmlu", "all", "dev")),
        Benchmark("csqa", "choice", "CommonsenseQA validation, zero-shot, option text scored", "csqa/validation",
                  style="qa", hub=("tau/commonsense_qa", None, "validation")),
        Benchmark(GENERAL, "general", "perplexity (and KL to a base model) on plain English text"),
        *_arithmetic_benchmarks(),
    ]
    for bench in builtins:
        if bench.name in _REGISTRY:
            raise ConfigError(f"built-in benchmark {bench.name!r} is defined twice")
        _REGISTRY[bench.name] = bench
    return _REGISTRY


def _arithmetic_benchmarks() -> list[Benchmark]:
    """arithmetic[-<operation>] and arithmetic-multidigit[-<operation>] (see the module docstring)."""
    out = []
    for which, name, what in (("split", "arithmetic", "held-out templates and operand pairs"),
                              ("multidigit", "arithmetic-multidigit", "held-out multi-digit operands (10-99)")):
        for ops in (OPERATIONS, *((op,) for op in OPERATIONS)):
            suffix = "" if len(ops) > 1 else f"-{ops[0]}"
            out.append(Benchmark(name + suffix, "arithmetic", f"{ops[0] if suffix else 'all operations'}, {what}, "
                                 f"{DEFAULT_SHOTS}-shot", n_shot=DEFAULT_SHOTS, max_shot=8, operations=ops,
                                 arithmetic=which))  # fmt: skip
    return out


def resolve_shots(bench: Benchmark, n_shot: int | None) -> int:
    """The number of solved examples: the benchmark's default, or n_shot if it has that many."""
    shots = bench.n_shot if n_shot is None else n_shot
    if not 0 <= shots <= bench.max_shot:
        raise ConfigError(f"{bench.name} takes 0 to {bench.max_shot} solved examples (n_shot), not {shots}")
    return shots


def _cot_prompt(question: str, shots: int) -> str:
    examples = "".join(f"Q: {q}\nA: {r} The answer is {a}.\n\n" for q, r, a in COT_EXEMPLARS[:shots])
    return f"{examples}Q: {question}\nA:"


def _options(item: EvalItem) -> str:
    return "".join(f"{choice_letter(i)}. {c}\n" for i, c in enumerate(item.choices))


def _choice_block(item: EvalItem, fmt: str, style: str, solved: bool) -> str:
    """One question in the mmlu / qa format; `solved` appends its answer (a few-shot example)."""
    head = f"{item.question}\n" if style == "mmlu" else f"Question: {item.question}\n"
    block = head + (_options(item) if fmt == "letter" else "") + "Answer:"
    if solved:
        assert isinstance(item.answer, int)
        block += " " + (choice_letter(item.answer) if fmt == "letter" else item.choices[item.answer]) + "\n\n"
    return block


def _mmlu_header(subject: str | None) -> str:
    about = f" about {subject.replace('_', ' ')}" if subject else ""
    return f"The following are multiple choice questions (with answers){about}.\n\n"


def build_prompts(
    bench: Benchmark,
    items: list[EvalItem],
    n_shot: int | None = None,
    choice_format: str | None = None,
    exemplars: list[EvalItem] | None = None,
    chat_tokenizer: Any = None,
) -> list[Prompt]:
    """The prompt of every item (see the module docstring); `chat_tokenizer` applies its chat template."""
    shots = resolve_shots(bench, n_shot)
    fmt = choice_format or bench.choice_format
    if fmt not in CHOICE_FORMATS:
        raise ConfigError(f"choice format {fmt!r} is not one of {', '.join(CHOICE_FORMATS)}")
    by_subject: dict[str | None, list[EvalItem]] = {}
    for ex in exemplars or []:
        by_subject.setdefault(ex.subject, []).append(ex)
    prompts = []
    for item in items:
        if bench.kind == "generate":
            prompts.append(Prompt(item, _wrap(_cot_prompt(item.question, shots), chat_tokenizer)))
            continue
        solved = by_subject.get(item.subject, [])[:shots] if shots else []
        if len(solved) < shots:
            raise ConfigError(
                f"{bench.name} has {len(solved)} solved examples for subject {item.subject!r}, fewer than "
                f"n_shot={shots}; lower n_shot"
            )
        text = _mmlu_header(item.subject) if bench.style == "mmlu" else ""
        text += "".join(_choice_block(ex, fmt, bench.style, solved=True) for ex in solved)
        text += _choice_block(item, fmt, bench.style, solved=False)
        space = "" if chat_tokenizer is not None else " "
        options = [choice_letter(i) for i in range(len(item.choices))] if fmt == "letter" else list(item.choices)
        prompts.append(Prompt(item, _wrap(text, chat_tokenizer), tuple(space + o for o in options)))
    return prompts


def _wrap(text: str, chat_tokenizer: Any) -> str:
    """The prompt as one user message in the tokenizer's chat template (trailing "A:"/"Answer:" dropped)."""
    if chat_tokenizer is None:
        return text
    if not getattr(chat_tokenizer, "chat_template", None):
        raise ConfigError("chat_template is on but the tokenizer has no chat template; turn it off")
    message = text.removesuffix("A:").removesuffix("Answer:").rstrip()
    return str(chat_tokenizer.apply_chat_template(
        [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
    ))


def stop_strings(chat: bool) -> tuple[str, ...]:
    """Where generated text is cut: a blank line or a new turn (only a new turn with the chat template)."""
    return CHAT_STOP_STRINGS if chat else STOP_STRINGS
