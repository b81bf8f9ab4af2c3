"""SFT data: row filtering, answer-only labels in both prompt formats, padding, and the batch plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arithmech.errors import ConfigError, DataError
from arithmech.finetune.data import BatchPlan, collate, rank_micro_batches, tokenize_examples
from arithmech.finetune.sft_rows import SFTExample, read_sft_examples, resolve_sft_data

from tiny_models import make_tiny_tokenizer

CHAT = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_rationale_rows_are_filtered_and_cleaned(sft_jsonl: Path) -> None:
    examples, counts = read_sft_examples(sft_jsonl, "rationale")
    assert counts == {"rows": 35, "kept": 32, "no_rationale": 1, "rationale_incorrect": 2}
    assert {"toy-003", "toy-004", "toy-005"}.isdisjoint(ex.id for ex in examples)
    first = examples[0]
    assert first.target == "1 + 2 = 3. The answer is 3."  # calculator annotation removed, answer sentence added
    answers, counts = read_sft_examples(sft_jsonl, "answer")
    assert counts["kept"] == 35 and answers[0].target == "3"


def test_plain_format_labels_only_the_answer_and_eos() -> None:
    tok = make_tiny_tokenizer()
    data, counts = tokenize_examples(tok, [SFTExample("a", "What is 2+2?", "4")], max_length=64)
    assert counts["format"] == "plain"
    ex = data[0]
    assert tok.decode(ex.input_ids[: ex.n_prompt]) == "Question: What is 2+2?\nAnswer: "
    assert list(ex.input_ids[ex.n_prompt :]) == [ord("4"), tok.eos_token_id]
    batch = collate(data, tok.pad_token_id)
    labels = batch["labels"][0]
    assert (labels[: ex.n_prompt] == -100).all() and labels[ex.n_prompt :].tolist() == [ord("4"), tok.eos_token_id]


def test_chat_template_prompt_ends_at_the_assistant_turn() -> None:
    tok = make_tiny_tokenizer()
    tok.chat_template = CHAT
    data, counts = tokenize_examples(tok, [SFTExample("a", "2+2?", "4")], max_length=64)
    assert counts["format"] == "chat"
    ex = data[0]
    assert tok.decode(ex.input_ids[: ex.n_prompt]) == "<|user|>2+2?<|end|><|assistant|>"
    assert tok.decode(ex.input_ids[ex.n_prompt :]) == "4<|end|>"
    plain, counts = tokenize_examples(tok, [SFTExample("a", "2+2?", "4")], max_length=64, chat_template=False)
    assert counts["format"] == "plain"


def test_collate_pads_right_and_masks_padding() -> None:
    tok = make_tiny_tokenizer()
    examples = [SFTExample("a", "1+1?", "2"), SFTExample("b", "a longer question?", "10")]
    data, _ = tokenize_examples(tok, examples, max_length=64)
    batch = collate(data, tok.pad_token_id)
    short = len(data[0].input_ids)
    assert batch["input_ids"].shape == (2, len(data[1].input_ids))
    assert (batch["input_ids"][0, short:] == tok.pad_token_id).all()
    assert batch["attention_mask"][0].sum() == short and (batch["labels"][0, short:] == -100).all()
    assert int((batch["labels"] != -100).sum()) == data[0].n_target + data[1].n_target


def test_too_long_examples_are_dropped_and_counted() -> None:
    tok = make_tiny_tokenizer()
    examples = [SFTExample("a", "short?", "1"), SFTExample("b", "x" * 80, "2")]
    data, counts = tokenize_examples(tok, examples, max_length=40)
    assert [ex.id for ex in data] == ["a"] and counts["too_long"] == 1
    with pytest.raises(DataError, match="raise --max-length"):
        tokenize_examples(tok, examples[1:], max_length=40)


def test_batch_plan_is_a_function_of_seed_and_step() -> None:
    plan = BatchPlan(n_examples=21, batch_size=4, epochs=2, seed=3)
    assert plan.steps_per_epoch == 5 and plan.total_steps == 10  # the last partial batch is dropped
    epoch0 = [i for s in range(5) for i in plan.step_indices(s)]
    epoch1 = [i for s in range(5, 10) for i in plan.step_indices(s)]
    assert len(set(epoch0)) == 20 and len(set(epoch1)) == 20 and epoch0 != epoch1
    again = BatchPlan(n_examples=21, batch_size=4, epochs=2, seed=3)
    assert [again.step_indices(s) for s in range(10)] == [plan.step_indices(s) for s in range(10)]
    assert BatchPlan(21, 4, 2, seed=4).step_indices(0) != plan.step_indices(0)
    assert BatchPlan(21, 4, 2, seed=3, max_steps=12).total_steps == 12
    with pytest.raises(ConfigError, match="larger than the 3 training examples"):
        BatchPlan(3, 4, 1, 0)


def test_ranks_split_a_global_batch_into_disjoint_micro_batches() -> None:
    indices = list(range(100, 112))
    parts = [rank_micro_batches(indices, rank, 2, 3) for rank in range(2)]
    assert parts[0] == [[100, 101, 102], [103, 104, 105]] and parts[1] == [[106, 107, 108], [109, 110, 111]]


def test_training_data_is_found_by_name_or_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "data" / "gsm8k"
    folder.mkdir(parents=True)
    (folder / "train.jsonl").write_text(json.dumps({"question": "q", "answer": "1"}) + "\n")
    assert resolve_sft_data("gsm8k", tmp_path / "data") == folder / "train.jsonl"
    monkeypatch.setenv("ARITHMECH_DATA", str(tmp_path / "data"))
    assert resolve_sft_data("gsm8k") == folder / "train.jsonl"
    assert resolve_sft_data(str(folder / "train.jsonl")) == folder / "train.jsonl"
    with pytest.raises(DataError, match="neither a file nor one of"):
        resolve_sft_data(str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "no answer"}\n')
    with pytest.raises(DataError, match="line 1 is not a JSON object with question and answer"):
        read_sft_examples(bad)
