"""Stratified prompt samples: every operation and template gets its share, seeded, in the set's own order."""

from __future__ import annotations

from collections import Counter

from arithmech.data import GenerationConfig, PromptPair, generate_pairs
from arithmech.data.sampling import sample_pairs, sample_record, stratified_sample


def pairs_in_template_order(per_template: dict[tuple[str, str], int]) -> list[PromptPair]:
    """As identify writes them: all prompts of one template, then the next."""
    out = []
    for (operation, template), n in per_template.items():
        out += [PromptPair(f"{template} {i}", f"{template} x{i}", "1", template, operation) for i in range(n)]
    return out


def test_spreads_a_small_sample_over_every_template() -> None:
    pairs = generate_pairs(GenerationConfig(operations=("addition",), n_per_template=10, seed=0))  # 12 templates
    chosen = stratified_sample(pairs, 24, seed=0)
    per_template = Counter(pairs[i].template_id for i in chosen)
    assert len(per_template) == 12 and set(per_template.values()) == {2}
    formations = Counter(pairs[i].formation for i in chosen)
    assert formations == {"equation": 8, "statement": 8, "qa": 8}  # the first 24 would be Equation only
    assert chosen == sorted(chosen) and len(set(chosen)) == 24


def test_balances_operations_before_templates() -> None:
    pairs = pairs_in_template_order({("addition", "a1"): 20, ("addition", "a2"): 20, ("addition", "a3"): 20,
                                     ("division", "d1"): 20})  # fmt: skip
    chosen = stratified_sample(pairs, 8, seed=3)
    assert Counter(pairs[i].operation for i in chosen) == {"addition": 4, "division": 4}
    assert max(Counter(pairs[i].template_id for i in chosen if pairs[i].operation == "addition").values()) == 2


def test_a_stratum_with_too_few_prompts_gives_its_share_to_the_others() -> None:
    pairs = pairs_in_template_order({("addition", "a1"): 1, ("addition", "a2"): 10, ("subtraction", "s1"): 10})
    chosen = stratified_sample(pairs, 9, seed=0)
    per_template = Counter(pairs[i].template_id for i in chosen)
    assert per_template["a1"] == 1 and sum(per_template.values()) == 9
    assert abs(per_template["a2"] + 1 - per_template["s1"]) <= 1


def test_seeded_and_complete() -> None:
    pairs = pairs_in_template_order({("addition", f"t{k}"): 7 for k in range(5)})
    assert stratified_sample(pairs, 10, seed=1) == stratified_sample(pairs, 10, seed=1)
    assert stratified_sample(pairs, 10, seed=1) != stratified_sample(pairs, 10, seed=2)
    assert stratified_sample(pairs, 100, seed=0) == list(range(len(pairs)))
    # a larger sample extends a smaller one (the same deal), so held-out prompts are the rest of it
    assert set(stratified_sample(pairs, 5, seed=4)) <= set(stratified_sample(pairs, 12, seed=4))


def test_record_names_the_prompts_and_the_counts() -> None:
    pairs = pairs_in_template_order({("addition", "a1"): 3, ("multiplication", "m1"): 3})
    chosen, record = sample_pairs(pairs, 4, seed=0)
    assert record == sample_record(pairs, stratified_sample(pairs, 4, seed=0))
    assert record["n"] == 4 and record["of"] == 6 and len(record["indices"]) == 4
    assert record["per_operation"] == {"addition": 2, "multiplication": 2}
    assert [pairs[i] for i in record["indices"]] == chosen
