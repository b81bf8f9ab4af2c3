"""MIB prompt pairs as a `CircuitBatch`, kept only where the model gives both answers (the answer filter).

The answer filter keeps a pair only when the model's top token at END is the scored answer on the clean prompt
AND the counterfactual's scored answer on the counterfactual prompt. Why both: the metric m is
logit[answer] - logit[counterfactual answer], and faithfulness f = (m(C) - m(empty)) / (m(full) - m(empty)) is
a fraction of the way from the counterfactual behaviour to the clean one only when the two ends differ in sign.
m(full) is the clean run's m (> 0 when the model answers the clean prompt); under counterfactual ablation
m(empty) is the counterfactual run's m (< 0 when the model answers the counterfactual prompt). With a clean-only
filter, 8 MIB addition pairs on SmolLM2-135M gave m(full) = 2.04 and m(empty) = +1.08 (the counterfactual run
still preferred the clean answer's digit): a denominator of 0.96 and f up to 3.5 under EAP-IG's signed ranking.
With both, 8 pairs give m(full) = 1.59 and m(empty) = -1.46. (f above 1 can remain under the signed ranking: a
circuit of only positive-scored edges ablates the edges that work against the answer.) MIB's own loader filters
only by the label being one token (`HFEAPDataset.filter_dataset`, MIB-circuit-track): its models answer most
rows, ours does not, hence the stricter rule. Dropped rows are counted (`FilterCounts`) and reported.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch

from arithmech.circuits.batch import CircuitBatch
from arithmech.data.mib_arithmetic import PromptPairer, mib_prompt_stream
from arithmech.data.prompts import PromptPair
from arithmech.data.tokens import pad_id_of
from arithmech.errors import DataError
from arithmech.models.predictions import top_tokens_at
from arithmech.models.view import ModelView
from arithmech.progress import Progress

PROMPTS_PER_PAIR = 80
"""Most single prompts drawn per pair wanted before giving up: SmolLM2-135M answers between 1 MIB prompt in 9 and
1 in 37 with operands up to 99 (addition and subtraction, samples of 192-448 prompts), and a pair needs two."""


def circuit_batch(tokenizer: object, pairs: list[PromptPair]) -> CircuitBatch:
    """Right-padded token tensors of pairs made by `data.mib_arithmetic.mib_pairs` (equal lengths per pair)."""
    if not pairs:
        raise DataError("no prompt pairs to score; raise --n-prompts or check the operations")
    clean = [list(tokenizer(p.reference)["input_ids"]) for p in pairs]  # type: ignore[operator]
    cf = [list(tokenizer(p.counterfactual)["input_ids"]) for p in pairs]  # type: ignore[operator]
    width = max(len(ids) for ids in clean)
    pad = pad_id_of(tokenizer)

    def padded(rows: list[list[int]]) -> torch.Tensor:
        return torch.tensor([ids + [pad] * (width - len(ids)) for ids in rows])

    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in clean])
    return CircuitBatch(
        clean_ids=padded(clean), cf_ids=padded(cf), mask=mask,
        answer_ids=torch.tensor([int(p.extra["answer_id"]) for p in pairs]),
        cf_answer_ids=torch.tensor([int(p.extra["cf_answer_id"]) for p in pairs]),
    )  # fmt: skip


@dataclass(frozen=True)
class FilterCounts:
    """What the answer filter saw and kept, for one source of prompts (an operation or a dataset)."""

    source: str
    pairs: int
    """Pairs checked."""
    clean_missed: int
    """Pairs whose clean prompt the model does not answer (top token is not the scored answer)."""
    cf_missed: int
    """Pairs whose counterfactual prompt the model does not answer (some miss both)."""
    kept: int
    """Pairs that pass (the first n_prompts of them are used)."""
    unusable: int = 0
    """Dataset rows only: rows dropped before the model sees them (no digit token, unequal lengths, ...)."""
    unusable_why: str = ""
    """Dataset rows only: the unusable rows by reason, with the first row of each (`data/mib_dataset.Unusable`)."""
    shared: int = 0
    """Dataset evaluation rows only: rows dropped because their clean or counterfactual prompt is also a prompt of
    the find split (built-in prompts share none: their parts are disjoint by fact)."""
    prompts_drawn: int = 0
    """Built-in prompts only: single prompts drawn and checked before pairing (0 for a dataset)."""
    prompts_answered: int = 0

    def as_dict(self) -> dict[str, int | str]:
        return asdict(self)

    def describe(self) -> str:
        """One line for the log and the printout."""
        drawn = (
            f"{self.prompts_answered} of {self.prompts_drawn} prompts answered, paired; "
            if self.prompts_drawn else ""
        )  # fmt: skip
        why = f": {self.unusable_why}" if self.unusable_why else ""
        unusable = f"{self.unusable} rows unusable{why}; " if self.unusable else ""
        shared = f"{self.shared} rows share a prompt with the find split; " if self.shared else ""
        return (
            f"{self.source}: {drawn}{shared}{unusable}{self.kept} of {self.pairs} pairs pass ({self.clean_missed} "
            f"missed on the clean prompt, {self.cf_missed} on the counterfactual)"
        )


@torch.no_grad()
def answered_rows(view: ModelView, batch: CircuitBatch, batch_size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """[batch] bool twice: the model's top token at END is the answer on the clean prompt; is the counterfactual
    answer on the counterfactual prompt."""
    lengths = batch.mask.long().sum(-1).tolist()
    rows = [ids[:n].tolist() for ids in (batch.clean_ids, batch.cf_ids) for ids, n in zip(ids, lengths, strict=True)]
    reads = [[n - 1] for n in lengths] * 2
    tops = torch.tensor([t[0] for t in top_tokens_at(view, rows, reads, 0, batch_size)])
    n = len(batch)
    return tops[:n] == batch.answer_ids, tops[n:] == batch.cf_answer_ids


def filter_answered(
    view: ModelView,
    tokenizer: object,
    pairs: list[PromptPair],
    source: str,
    batch_size: int = 32,
    want: int | None = None,
    progress: Progress | None = None,
) -> tuple[list[PromptPair], FilterCounts]:
    """The pairs the model answers on both prompts, in order, and the counts. With `want`, pairs are checked in
    rounds until that many are kept (or PROMPTS_PER_PAIR / 2 x want pairs are checked: two prompts each).
    `progress` counts pairs checked, of at most that many (the total is set to the pairs checked at the end)."""
    limit = len(pairs) if want is None else min(len(pairs), PROMPTS_PER_PAIR * want // 2)
    kept: list[PromptPair] = []
    checked = clean_missed = cf_missed = 0
    if progress is not None:
        progress.total = limit
    while checked < limit and (want is None or len(kept) < want):
        size = limit if want is None else min(limit - checked, max(64, 8 * want))
        chunk = pairs[checked : checked + size]
        clean, cf = answered_rows(view, circuit_batch(tokenizer, chunk), batch_size)
        kept += [p for p, ok in zip(chunk, (clean & cf).tolist(), strict=True) if ok]
        checked += size
        clean_missed, cf_missed = clean_missed + int((~clean).sum()), cf_missed + int((~cf).sum())
        if progress is not None:
            progress.update(size)
    if progress is not None:
        progress.total = checked  # done: enough were kept before the limit
    return kept[:want], FilterCounts(source, checked, clean_missed, cf_missed, len(kept))


def answered_pairs(
    view: ModelView,
    tokenizer: object,
    operation: str,
    n: int,
    seed: int,
    max_operand: int,
    batch_size: int = 32,
    part: str | None = None,
    progress: Progress | None = None,
) -> tuple[list[PromptPair], FilterCounts]:
    """Up to `n` built-in MIB pairs (of `part`'s facts, when given: `data.mib_arithmetic`) that pass the answer
    filter: single prompts are drawn in rounds and checked, those the model answers are paired (`PromptPairer`),
    and the pairs are checked again as pairs (the same filter as for a dataset's rows; padding in a batch can
    move a near tie). At most PROMPTS_PER_PAIR x n prompts are drawn; `progress` counts prompts checked, of that
    many (the total is set to the prompts drawn at the end), then the pairs' check adds its pairs."""
    stream = mib_prompt_stream(tokenizer, operation, seed, max_operand, part)
    pairer = PromptPairer(operation)
    pairs: list[PromptPair] = []
    drawn = answered = 0
    pad = pad_id_of(tokenizer)
    if progress is not None:
        progress.total = PROMPTS_PER_PAIR * n
    while len(pairs) < n and drawn < PROMPTS_PER_PAIR * n:
        prompts = [next(stream) for _ in range(min(max(64, 8 * n), PROMPTS_PER_PAIR * n - drawn))]
        drawn += len(prompts)
        rows = [list(tokenizer(p.text)["input_ids"]) for p in prompts]  # type: ignore[operator]
        tops = top_tokens_at(view, rows, [[len(r) - 1] for r in rows], pad, batch_size)
        for prompt, top in zip(prompts, tops, strict=True):
            if top[0] == prompt.answer_id:
                answered += 1
                pair = pairer.add(prompt)
                if pair is not None:
                    pairs.append(pair)
        if progress is not None:
            progress.update(len(prompts))
    if progress is not None:
        progress.total = drawn + len(pairs[:n])  # done drawing; the pairs' check follows
    kept, counts = filter_answered(view, tokenizer, pairs[:n], operation, batch_size)
    if progress is not None:
        progress.update(len(pairs[:n]))
    return kept, replace(counts, prompts_drawn=drawn, prompts_answered=answered)
