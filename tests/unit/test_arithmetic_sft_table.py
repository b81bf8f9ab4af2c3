"""experiments/arithmetic_sft_table.py on hand-written run folders: the table, the positive control and effect-ranked
vs random heads as paired differences with clustered t intervals over the same seeds (df stated, comparisons.csv),
whether the rows are parameter-matched, the cross-operation fact count, LoRA's matched rank, the sweep score, the
one learning-rate rule, and random-k heads drawn to touch as many key/value groups as the top-k."""

from __future__ import annotations

import csv
import json
import statistics
import sys
from argparse import Namespace
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
if str(EXPERIMENTS) not in sys.path:  # the experiment scripts are not a package
    sys.path.insert(0, str(EXPERIMENTS))

import arithmetic_sft as driver  # noqa: E402
import arithmetic_sft_compare as compare  # noqa: E402
import arithmetic_sft_table as table  # noqa: E402

from arithmech.data.arithmetic_split import make_split  # noqa: E402
from arithmech.data.facts import fact_of  # noqa: E402
from arithmech.evaluate.arithmetic import GROUP_COLUMNS, group_rows  # noqa: E402
from arithmech.evaluate.clustered_interval import clustered_difference  # noqa: E402

ARGS = Namespace(ops=("subtraction",), ks=[8], split_seed=0)
SMOLLM2 = {"d_model": 576, "n_heads": 9, "n_kv_heads": 3, "d_head": 64, "n_layers": 30}
PROBLEMS = [(9, b) for b in range(10)] + [(8, b) for b in range(9)] + [(7, 0)]  # 20 subtraction problems
PROMPTS = [(f"sub-t{i % 6}", *PROBLEMS[i // 6]) for i in range(120)]  # 6 templates x 20 problems, interleaved


def records_of(correct: int, offset: int = 0) -> list[dict[str, object]]:
    """The 120 test records of a row whose prompts offset .. offset + correct - 1 are answered right."""
    return [{"template_id": t, "operation": "subtraction", "formation": "qa", "a": a, "b": b, "gold": str(a - b),
             "correct": offset <= i < offset + correct, "exact": offset <= i < offset + correct // 2,
             "n_answer_tokens": 1, "tokens_correct": int(offset <= i < offset + correct)}
            for i, (t, a, b) in enumerate(PROMPTS)]  # fmt: skip


def write_row(folder: Path, correct: int, lr: float | None, offset: int = 0, kl: float = 0.001,
              params: int = 1_105_920) -> Path:
    """A finished row: training metadata (unless base), the test part's records and arithmetic.csv, general."""
    records = records_of(correct, offset)
    groups = [*group_rows("arithmetic", records), *group_rows("arithmetic-multidigit-subtraction", records)]
    (folder / "eval-test" / "examples").mkdir(parents=True)
    (folder / "eval-test" / "examples" / "arithmetic.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "eval-test" / "arithmetic.csv").write_text(",".join(GROUP_COLUMNS) + "\n" + "".join(
        ",".join(str(g[c]) for c in GROUP_COLUMNS) + "\n" for g in groups))  # fmt: skip
    general = {"mmlu": {"correct": 5, "n": 20}, "csqa": {"correct": 4, "n": 20},
               "general": {"info": {"perplexity": 37.5, "kl": kl if lr else None}}}  # fmt: skip
    (folder / "eval-general").mkdir()
    (folder / "eval-general" / "metadata.json").write_text(json.dumps({"benchmarks": general}))
    if lr is not None:
        meta = {"config": {"lr": lr}, "trainable_parameters": params, "samples_per_second": 3.2,
                "peak_memory": {"bytes": 2 * 2**30}, "selection": {"heads": ["14.2", "13.6"]}}  # fmt: skip
        (folder / "metadata.json").write_text(json.dumps(meta))
    return folder


def run(tmp_path: Path, full: tuple[int, int], random_params: int = 1_105_920) -> str:
    rows: dict[str, Path | None] = {"base": None}
    write_row(tmp_path / "base", 30, None)
    for name, correct, lr in (("precise-top8-seed0", 60, 1e-3), ("precise-top8-seed1", 62, 1e-3),
                              ("precise-top8-seed2", 58, 1e-3), ("precise-random8-seed0", 36, 1e-3),
                              ("precise-random8-seed1", 40, 1e-3), ("precise-random8-seed2", 44, 1e-3),
                              ("lora", 50, 1e-3)):  # fmt: skip
        rows[name] = write_row(tmp_path / name, correct, lr, params=random_params if "random" in name else 1_105_920)
    rows["full"] = write_row(tmp_path / "full", full[0], 1e-4, offset=full[1])
    table.write_outputs(tmp_path, rows, ARGS)
    return (tmp_path / "table.md").read_text()


def test_table_control_top_vs_random_and_related_facts(tmp_path: Path) -> None:
    text = run(tmp_path / "a", full=(77, 0))
    top0 = group_rows("arithmetic", records_of(60))[1]  # the subtraction row, clustered by template and fact
    assert "| precise-top8-seed0 | 0.001 | 1,105,920 | 3.20 | 2,048 | " in text
    assert f"50.0% [{top0['ci_low']:.0%}, {top0['ci_high']:.0%}]" in text
    assert "- positive control, subtraction: full SFT minus base +39.2 points [" in text
    assert "] (t on 5 df: min(6 templates, 11 facts) - 1 = 5): above 0" in text  # one seed a side: the clusters' df
    # effect-ranked minus random: per-prompt means over the 3 seeds of each side, plus each side's seed-to-seed
    # variance on its own 3 - 1 df
    top = [records_of(c) for c in (60, 62, 58)]
    rand = [records_of(c) for c in (36, 40, 44)]
    d = [statistics.fmean(r[i]["correct"] for r in top) - statistics.fmean(r[i]["correct"] for r in rand)
         for i in range(120)]  # fmt: skip
    seeds = [(statistics.variance([0.5, 62 / 120, 58 / 120]) / 3, 2), (statistics.variance([0.3, 40 / 120, 44 / 120])
                                                                        / 3, 2)]  # fmt: skip
    keys = sorted(range(120), key=lambda i: PROMPTS[i])
    want = clustered_difference([d[i] for i in keys], [PROMPTS[i][0] for i in keys],
                                [fact_of("subtraction", *PROMPTS[i][1:]) for i in keys], seeds)  # fmt: skip
    assert ("- k = 8, subtraction: effect-ranked 50.0% vs random 33.3% (means over 3 and 3 seeds: 50.0%, 51.7%, "
            f"48.3% vs 30.0%, 33.3%, 36.7%); difference {compare.points(want)} (t on {want.df:.1f} df, "
            "Welch-Satterthwaite of min(6 templates, 11 facts) - 1 = 5 and seeds 3 - 1, 3 - 1); trainable "
            "parameters 1,105,920 both") in text  # fmt: skip
    assert want.mean == pytest.approx(20 / 120) and want.low > 0 and 2 < want.df < 5 + 2 + 2
    assert "so the rows are parameter-matched: the same number of heads and of trainable parameters" in text
    saved = list(csv.DictReader((tmp_path / "a" / table.COMPARISONS_FILE).open()))
    assert [(c["comparison"], c["k"], c["seeds_a"], c["seeds_b"]) for c in saved] == [
        ("full - base", "", "1", "1"), ("effect-ranked - random", "8", "3", "3")]
    assert float(saved[1]["df"]) == pytest.approx(want.df) and float(saved[1]["ci_low"]) == pytest.approx(want.low)
    assert saved[1]["trainable_parameters_a"] == saved[1]["trainable_parameters_b"] == "1105920"
    related = make_split(0).related_fact_trained(("subtraction",))
    assert f"addition {related['addition']['related']} of {related['addition']['test']}" in text
    assert "| base | - | - | - | - |" in text and text.count("| 5/20 | 4/20 | 37.50 |") == 9
    assert (tmp_path / "a" / "arithmetic_sft.png").is_file() and (tmp_path / "a" / "table.csv").is_file()
    weak = run(tmp_path / "b", full=(34, 20), random_params=1_179_648)  # right on other prompts: a noisy +3.3
    assert "full SFT minus base +3.3 points [" in weak and "NOT above 0: the setup is too small" in weak
    assert "trainable parameters NOT matched: 1105920 vs 1179648" in weak and "NOT parameter-matched" in weak


def test_rows_scored_on_other_prompts_are_refused(tmp_path: Path) -> None:
    write_row(tmp_path / "x", 30, None)
    write_row(tmp_path / "y", 30, None)
    lines = (tmp_path / "y" / compare.RECORDS).read_text().splitlines()[:-1]  # one prompt fewer
    (tmp_path / "y" / compare.RECORDS).write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="not scored on the same subtraction test prompts"):
        compare.paired_difference([tmp_path / "x"], [tmp_path / "y"], "subtraction")


def test_one_learning_rate_rule_for_every_row() -> None:
    """The best mean over seeds wins, ties go to the smaller rate, whichever side the row is on (issue #21: top-32
    got 1e-4 by a tie-break against random-32's 3e-4 on one seed)."""
    assert driver.choose_lr({1e-4: [0.6, 0.8], 3e-4: [0.7, 0.7], 1e-3: [0.5, 0.9]}) == 1e-4  # three-way tie
    assert driver.choose_lr({3e-4: [0.7, 0.72], 1e-4: [0.7, 0.7]}) == 3e-4
    sizes = Namespace(ks=[8, 32], seeds=3, lrs_precise=[1e-4, 3e-4, 1e-3], lrs_full=[1e-5, 3e-5, 1e-4],
                      lrs_lora=[3e-4, 1e-3, 3e-3])  # fmt: skip
    types = driver.row_types(sizes)
    assert types["precise-top8"] == types["precise-random8"] == ([1e-4, 3e-4, 1e-3], [0, 1, 2])
    trainings, validations, rows = table.plan_counts(sizes)
    assert sum(trainings.values()) == 2 * 2 * 3 * 3 + 3 + 3 and validations == 43 and rows == 15
    five = Namespace(**{**vars(sizes), "seeds": 5, "sweep_seeds": 3})  # the rate on 3 seeds, 2 more at it
    trainings, validations, rows = table.plan_counts(five)
    assert trainings["precise-random8"] == 3 * 3 + 2 and validations == 4 * 9 + 3 + 3 + 1 and rows == 23


def test_the_other_seeds_train_at_the_chosen_rate_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeds past --sweep-seeds are not swept: they train once, at the rate the swept seeds chose."""
    trained: list[str] = []
    def train(a: Namespace, folder: Path, how: list[str], lr: float, seed: int = 0) -> None:
        trained.append(f"{folder.parent.name}/{folder.name}")

    monkeypatch.setattr(driver, "train", train)
    monkeypatch.setattr(driver, "evaluate", lambda *args: None)
    monkeypatch.setattr(driver, "sweep_score", lambda folder, ops: 0.9 if "lr-0.001" in str(folder) else 0.5)
    monkeypatch.setattr(driver, "finetune_args", lambda *args: [])
    plan = Namespace(ks=[8], seeds=4, sweep_seeds=2, lrs_precise=[3e-4, 1e-3], lrs_full=[1e-5], lrs_lora=[1e-3],
                     ops=("subtraction",))  # fmt: skip
    best = driver.sweep(plan, tmp_path)
    assert best["precise-top8"] == (1e-3, [0, 1, 2, 3])
    top = trained[: 2 * 2 + 2]
    assert top == ["lr-0.0003/seed-0", "lr-0.0003/seed-1", "lr-0.001/seed-0", "lr-0.001/seed-1", "lr-0.001/seed-2",
                   "lr-0.001/seed-3"]  # fmt: skip


def test_lora_rank_matches_the_precise_parameter_count(tmp_path: Path) -> None:
    assert table.lora_params_per_rank(SMOLLM2) == 115_200  # r * (576 + 576 + 2 * (576 + 192) + 576 + 576) * 30
    (tmp_path / "identify").mkdir()
    (tmp_path / "identify" / "metadata.json").write_text(json.dumps({"dims": SMOLLM2}))
    (tmp_path / "precise").mkdir()
    (tmp_path / "precise" / "metadata.json").write_text(json.dumps({"trainable_parameters": 3_981_312}))
    assert table.lora_rank(tmp_path / "precise", tmp_path / "identify") == 35  # 4,032,000 vs 3,981,312


def test_sweep_score_is_the_mean_over_training_operations(tmp_path: Path) -> None:
    folder = tmp_path / "eval-validation"
    folder.mkdir()
    rows = ["arithmetic-subtraction,subtraction,all,66,33,0.5,0.38,0.62,33,0.5,0.38,0.62",
            "arithmetic-division,division,all,42,21,0.25,0.14,0.4,21,0.25,0.14,0.4"]  # fmt: skip
    (folder / "arithmetic.csv").write_text(",".join(GROUP_COLUMNS) + "\n" + "\n".join(rows) + "\n")
    assert table.sweep_score(folder, ("subtraction", "division")) == pytest.approx(0.375)


def test_random_heads_touch_as_many_key_value_groups_as_the_top_k(tmp_path: Path) -> None:
    """Each seed draws its own heads, each draw as many heads and K/V groups (so parameters) as the top-k."""
    folder = tmp_path / "identify"
    folder.mkdir()
    dims = {**SMOLLM2, "d_vocab": 49152}
    (folder / "metadata.json").write_text(json.dumps({"stage": "identify", "dims": dims}))
    effects = {"14.2": -0.5, "13.6": -0.4, "14.6": -0.3, "13.0": -0.2, "20.1": -0.1, "14.8": -0.09, "13.3": -0.08,
               "19.5": -0.07, "mlp.20": -0.9, "2.2": -0.01, "3.3": 0.2}  # fmt: skip
    (folder / "effects.csv").write_text("component,effect\n" + "".join(f"{c},{e}\n" for c, e in effects.items()))
    draws = [driver.random_heads(folder, 8, seed).split(",") for seed in range(5)]
    assert len({tuple(d) for d in draws}) == 5 and draws[0] == driver.random_heads(folder, 8, 0).split(",")
    for heads in draws:  # the top-8 heads (mlp.20 is not a head) sit in 7 groups of 3: 14.6 and 14.8 share one
        assert len(set(heads)) == 8 and len({(h.split(".")[0], int(h.split(".")[1]) // 3) for h in heads}) == 7


def test_estimate_times_lora_at_its_own_precise_runs_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--estimate trains no sweep folder, so LoRA's rank comes from the timed precise top-max(k) run (it once read
    the sweep's and failed)."""
    (tmp_path / "identify").mkdir()
    (tmp_path / "identify" / "metadata.json").write_text(json.dumps({"dims": SMOLLM2, "timings": {"patch": 5.0}}))
    trained: dict[str, list[str]] = {}

    def fake_train(a: Namespace, folder: Path, how: list[str], lr: float, seed: int = 0) -> None:
        folder.mkdir(parents=True)
        (folder / "train_log.csv").write_text("step,seconds\n1,2.5\n2,2.0\n")
        (folder / "metadata.json").write_text(json.dumps({"trainable_parameters": 3_981_312}))
        trained[folder.name] = how

    monkeypatch.setattr(driver, "identify", lambda a, out: out / "identify")
    monkeypatch.setattr(driver, "train", fake_train)
    monkeypatch.setattr(driver, "evaluate", lambda *args: None)
    monkeypatch.setattr(driver, "print_estimate", lambda *args: None)
    plan = Namespace(ks=[8, 32], seeds=5, lrs_precise=[1e-3], lrs_full=[1e-4], lrs_lora=[1e-3], steps=16)
    driver.estimate(plan, tmp_path)
    assert sorted(trained) == ["full", "lora", "precise-top32", "precise-top8"]  # random-k rows time like top-k
    assert trained["lora"] == ["--method", "lora", "--lora-r", "35"] and not (tmp_path / "sweep").exists()
    timing = json.loads((tmp_path / "estimate.json").read_text())
    assert timing["identify_s"] == 5.0 and timing["lora"]["s_per_step"] == 2.0
