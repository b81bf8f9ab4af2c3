"""The evaluate stage's settings (stages/evaluate.py runs them), importable without torch.

The CLI builds `arithmech evaluate`'s options from these fields and checks every name (benchmarks, lm-eval
tasks) before a model loads, and the rows of every file of the user's (`check_files`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from arithmech.data.arithmetic_split import make_split
from arithmech.data.locate import is_jsonl_path
from arithmech.errors import ConfigError
from arithmech.evaluate.benchmarks import CHOICE_FORMATS, benchmark, benchmark_names
from arithmech.evaluate.general_texts import load_general_texts
from arithmech.evaluate.harness import HarnessOptions, task_manager
from arithmech.evaluate.loading import choice_items, load_rows, math_items
from arithmech.lineage import read_metadata

if TYPE_CHECKING:
    from arithmech.evaluate.runner import EvalOptions

DEFAULT_BENCHMARKS: tuple[str, ...] = ("gsm8k", "svamp", "addsub", "singleeq", "mmlu", "csqa")


@dataclass(frozen=True)
class EvaluateConfig:
    """Settings of the evaluate stage."""

    STAGE: ClassVar[str] = "evaluate"
    """The "stage" of its runs' metadata.json."""

    @staticmethod
    def reads_identify_run(_config: dict[str, Any]) -> bool:
        """Whether a run with this "config" read an identify run: never: it scores benchmarks."""
        return False

    benchmarks: tuple[str, ...] | None = field(
        default=None,
        metadata={"help": "benchmarks: gsm8k, svamp, addsub, singleeq, adapters-<set>, mmlu, csqa, general, "
                          "arithmetic[-<operation>], arithmetic-multidigit[-<operation>], or a .jsonl file; default "
                          "gsm8k,svamp,addsub,singleeq,mmlu,csqa, or none when harness tasks are given"},
    )
    limit: int | None = field(
        default=None, metadata={"help": "rows (texts for general) per benchmark, a seeded subset; all if unset"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the subsets (same seed = same rows)"})
    batch_size: int = field(default=8, metadata={"help": "prompts (or choice rows) per forward pass"})
    max_new_tokens: int = field(default=256, metadata={"help": "longest generated solution (math benchmarks)"})
    n_shot: int | None = field(
        default=None, metadata={"help": "solved examples per prompt; default each benchmark's (math 8, mmlu 5, csqa 0)"}
    )
    choice_format: str | None = field(
        default=None, metadata={"help": "letter or text scoring of choices; default mmlu letter, csqa text"}
    )
    chat_template: bool = field(
        default=False, metadata={"help": "wrap each prompt in the tokenizer's chat template (default: plain few-shot)"}
    )
    exclude_train_overlap: bool = field(
        default=False,
        metadata={"help": "drop math rows seen in training (orig_id or question text of the train file)"},
    )
    train_file: str | None = field(
        default=None, metadata={"help": "training JSONL for the overlap rule; default llm_adapters_math_v1/train"}
    )
    data_dir: str | None = field(
        default=None, metadata={"help": "data folder; else $ARITHMECH_DATA, then the sets shipped with arithmech"}
    )
    general_text: str | None = field(
        default=None, metadata={"help": "text file (paragraphs) or JSONL with text for the general check"}
    )
    general_max_tokens: int = field(default=512, metadata={"help": "tokens kept per general text"})
    base_model: str | None = field(
        default=None,
        metadata={"help": "base model for KL in the general check: hub id, folder, .gguf, or 'default'"},
    )
    split_seed: int = field(
        default=0, metadata={"help": "seed of the arithmetic train/test split; the same as the finetune stage's"}
    )
    allow_split_mismatch: bool = field(
        default=False,
        metadata={"help": "score arithmetic benchmarks on another split than the one a --delta was fine-tuned on "
                          "(its test prompts may be train prompts there)"},
    )  # fmt: skip
    arithmetic_part: str = field(
        default="test",
        metadata={"help": "arithmetic benchmarks ask: test (held-out templates and operand pairs) or validation "
                          "(train templates, validation pairs: for choosing hyperparameters)"},
    )  # fmt: skip
    harness_tasks: tuple[str, ...] = field(
        default=(),
        metadata={"help": "lm-evaluation-harness tasks, groups or tags (e.g. arc_easy,hellaswag); needs "
                          "pip install 'arithmech[lm-eval]'; limit takes each task's first rows"},
    )
    harness_include_path: str | None = field(
        default=None, metadata={"help": "folder of your own lm-eval task YAMLs, named in harness_tasks"}
    )
    harness_num_fewshot: int | None = field(
        default=None, metadata={"help": "few-shot examples per harness prompt; default each task's own (else 0)"}
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "harness_tasks", _names(self.harness_tasks))
        default = () if self.harness_tasks else DEFAULT_BENCHMARKS
        object.__setattr__(self, "benchmarks", default if self.benchmarks is None else _names(self.benchmarks))
        if not self.benchmarks and not self.harness_tasks:
            raise ConfigError("no benchmark given; name at least one, e.g. gsm8k,mmlu, or a harness task")
        self._check_harness()
        known = benchmark_names()
        for name in self.benchmarks:
            if name not in known and not is_jsonl_path(name):
                raise ConfigError(f"unknown benchmark {name!r}; use one of {', '.join(known)} or a .jsonl path")
        if len(set(self.benchmarks)) != len(self.benchmarks):
            raise ConfigError(f"benchmark list {', '.join(self.benchmarks)} names one benchmark twice; name it once")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be at least 1, or unset for all rows (got {self.limit})")
        for name in ("batch_size", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.general_max_tokens < 2:
            raise ConfigError(f"general_max_tokens must be at least 2 (got {self.general_max_tokens})")
        if self.n_shot is not None and self.n_shot < 0:
            raise ConfigError(f"n_shot must be 0 or more (got {self.n_shot})")
        if self.arithmetic_part not in ("test", "validation"):
            raise ConfigError(f"arithmetic_part {self.arithmetic_part!r} is not test or validation")
        if self.arithmetic_part != "test" and any(n.startswith("arithmetic-multidigit") for n in self.benchmarks):
            raise ConfigError("the multi-digit transfer set is held out for testing only; use arithmetic_part test")
        if self.choice_format is not None and self.choice_format not in CHOICE_FORMATS:
            raise ConfigError(f"choice_format {self.choice_format!r} is not one of {', '.join(CHOICE_FORMATS)}")

    def _check_harness(self) -> None:
        """Cheap checks first, then the names against lm-eval's task index, so a typo fails before a model loads."""
        if len(set(self.harness_tasks)) != len(self.harness_tasks):
            raise ConfigError(f"harness task list {', '.join(self.harness_tasks)} names one task twice; name it once")
        if not self.harness_tasks and (self.harness_include_path or self.harness_num_fewshot is not None):
            raise ConfigError("harness_include_path and harness_num_fewshot apply to harness tasks; name them too, "
                              "e.g. --harness-tasks my_task")  # fmt: skip
        if self.harness_include_path is not None and not Path(self.harness_include_path).is_dir():
            raise ConfigError(f"harness_include_path {self.harness_include_path!r} is not a folder; give the folder "
                              "holding your task YAML files")  # fmt: skip
        if self.harness_num_fewshot is not None and self.harness_num_fewshot < 0:
            raise ConfigError(f"harness_num_fewshot must be 0 or more (got {self.harness_num_fewshot})")
        if self.harness_tasks:
            task_manager(self.harness_tasks, self.harness_include_path)  # lm-eval installed, every name known

    def check_files(self) -> None:
        """Read the user's files as the stage will, so a malformed one fails before a model loads: each .jsonl
        benchmark (JSON objects; a question and a numeric answer, or choices and the right one), the training
        file of the overlap rule, and the general text."""
        for name in self.benchmarks or ():
            if is_jsonl_path(name):
                loaded = load_rows(name)
                if benchmark(name, loaded.rows[:1]).kind == "generate":
                    math_items(loaded.rows, loaded.origin)
                else:
                    choice_items(loaded.rows, loaded.origin)
        if self.exclude_train_overlap and self.train_file is not None:
            load_rows(self.train_file, self.data_dir)
        if self.general_text is not None and "general" in (self.benchmarks or ()):
            load_general_texts(self.general_text)

    def refuse_other_split(self, trained: dict[str, Any], what: str, prefix: str = "") -> None:
        """ConfigError when the arithmetic benchmarks would ask another split than the one `what` was fine-tuned
        on (`trained`: its split.json, or at least its "seed" and "fingerprint"): a test prompt of one split may be
        a train prompt of another, so its accuracy could be memorisation. Off with allow_split_mismatch. `prefix`
        "evaluate." names config keys (`arithmetic run`), "" the CLI options."""
        asked = [n for n in self.benchmarks or () if not is_jsonl_path(n) and benchmark(n).kind == "arithmetic"]
        split = make_split(self.split_seed)
        if self.allow_split_mismatch or not asked or trained.get("fingerprint") == split.fingerprint:
            return
        seed = trained.get("seed")
        fix = (f"{prefix}split_seed: {seed}, or give {prefix}allow_split_mismatch: true" if prefix
               else f"--split-seed {seed}, or give --allow-split-mismatch")  # fmt: skip
        raise ConfigError(
            f"{what} was fine-tuned on the arithmetic split of seed {seed} (fingerprint {trained.get('fingerprint')}), "
            f"but {', '.join(asked)} would ask the split of seed {self.split_seed} ({split.fingerprint}), whose test "
            f"prompts it may have trained on; evaluate with {fix} to score them anyway"
        )

    def harness_options(self) -> HarnessOptions:
        """The harness bridge's options: its own fields plus the shared limit, seed, batch size and chat template."""
        return HarnessOptions(tasks=self.harness_tasks, include_path=self.harness_include_path,
                              num_fewshot=self.harness_num_fewshot, limit=self.limit, seed=self.seed,
                              batch_size=self.batch_size, chat_template=self.chat_template)  # fmt: skip

    def options(self) -> EvalOptions:
        """The runner's options (every field but the benchmark list and the base model)."""
        from arithmech.evaluate.runner import EvalOptions

        names = {f.name for f in fields(EvalOptions)}
        return EvalOptions(**{k: v for k, v in asdict(self).items() if k in names})


def trained_split(delta: Path) -> dict[str, Any] | None:
    """The arithmetic split a finetune output folder was trained on (its split.json); None when it was trained on
    other data (no split.json)."""
    return read_metadata(delta, "split.json", "finetune")


def _names(value: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """A comma list ("a, b") or a sequence of names as a tuple."""
    if isinstance(value, str):
        return tuple(n.strip() for n in value.split(",") if n.strip())
    return tuple(value)
