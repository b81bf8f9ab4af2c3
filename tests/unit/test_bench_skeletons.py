"""The skeleton benchmarks (issue 33, items 3 and 4) at --quick widths: every stage run measured and planned, a run
planned above the memory at hand skipped, finished runs resumed, and 16-bit numerics against float32."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH_DIR) not in sys.path:  # the benchmark scripts are not a package; they import each other by name
    sys.path.insert(0, str(BENCH_DIR))

import measured_peak  # noqa: E402
import plan_skeletons  # noqa: E402
import skeleton_numerics  # noqa: E402
from skeleton_stages import RUNS  # noqa: E402
from skeletons import SKELETON_PRESETS, build_skeleton, skeleton_shape  # noqa: E402

from arithmech.plan.presets import PRESETS  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
QUICK = ["--quick", "--presets", "llama3.1-8b", "--dtypes", "float32"]


@pytest.fixture(autouse=True)
def _no_record(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARITHMECH_BENCH_RECORD", raising=False)


@pytest.mark.parametrize("preset", SKELETON_PRESETS)
def test_a_quick_skeleton_keeps_its_presets_proportions(preset: str) -> None:
    full, quick = PRESETS[preset], skeleton_shape(preset, 2, quick=True)
    assert quick.group_size == full.group_size and quick.tied_embeddings == full.tied_embeddings
    assert quick.n_heads * quick.d_head / quick.d_model == pytest.approx(full.n_heads * full.d_head / full.d_model, 0.1)
    model = build_skeleton(quick, "float32")
    assert sum(p.numel() for p in model.parameters()) == quick.n_params  # the plan counts what is built
    assert skeleton_shape(preset, 4).d_vocab == full.d_vocab and skeleton_shape(preset, 4).n_layers == 4


def test_every_stage_run_is_measured_beside_its_plan(capsys: pytest.CaptureFixture[str]) -> None:
    metrics = plan_skeletons.main([*QUICK, "--layers", "2,3", "--stages", "identify-total,circuit,finetune-full"])
    rows = metrics["rows"]
    # finetune reads identify-path's folder, so that run joins the selection
    assert [r["stage"] for r in rows[:4]] == ["identify-path", "identify-total", "circuit", "finetune-full"]
    assert metrics["runs_measured"] == 8 and metrics["runs_failed"] == 0 and metrics["runs_skipped"] == 0
    for row in rows:
        assert row["planned_bytes"] > 0 and row["measured_bytes"] > 0 and row["rss_bytes"] is not None
        assert row["tokens"] > 0 and row["seconds"] > 0 and row["estimated_s"] > 0
    circuit = [r["shared_tokens"] for r in rows if r["stage"] == "circuit"]
    assert circuit == [len("Q: How much is ")] * 2  # the character-level tokenizer's shared prefix, planned with
    assert len(metrics["growth"]) == 4 and {g["layers"][0] for g in metrics["growth"]} == {2}
    full_sft = [g for g in metrics["growth"] if g["stage"] == "finetune-full"][0]
    assert full_sft["measured_per_layer"] > 0 and full_sft["planned_per_layer"] > 0  # gradients and moments grow
    out = capsys.readouterr().out
    assert "planned" in out and "measured" in out and "runs measured" in out


def test_a_run_planned_above_the_budget_is_skipped_before_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a skipped run must not start")

    monkeypatch.setattr(plan_skeletons, "measure", never)
    metrics = plan_skeletons.main([*QUICK, "--layers", "2", "--stages", "identify-path", "--max-memory", "64KiB"])
    (row,) = metrics["rows"]
    assert row["status"] == "skipped" and "is above the 64.0 KiB at hand" in row["note"]
    assert metrics["runs_measured"] == 0 and metrics["runs_skipped"] == 1


def test_finished_runs_are_resumed_at_the_same_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    progress = tmp_path / "runs" / "progress.jsonl"
    args = [*QUICK, "--layers", "2", "--stages", "identify-path", "--resume", str(progress)]
    first = plan_skeletons.main(args)
    assert len(progress.read_text().splitlines()) == 1

    def never(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a finished run must not run again")

    monkeypatch.setattr(plan_skeletons, "measure", never)
    assert plan_skeletons.main(args)["rows"] == first["rows"]
    line = json.loads(progress.read_text())
    progress.write_text(json.dumps({**line, "git_sha": "another commit"}) + "\n")
    monkeypatch.undo()
    monkeypatch.delenv("ARITHMECH_BENCH_RECORD", raising=False)
    assert plan_skeletons.main(args)["runs_measured"] == 1  # measured again, and kept
    assert len(progress.read_text().splitlines()) == 2


def test_runs_kept_at_a_commit_that_measured_the_same_code_are_planned_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    progress = tmp_path / "runs" / "progress.jsonl"
    args = [*QUICK, "--layers", "2", "--stages", "identify-path", "--resume", str(progress)]
    first = plan_skeletons.main(args)
    line = json.loads(progress.read_text())
    stale_plan = {**line["row"], "planned_bytes": 1, "planned_peak_bytes": 1}
    progress.write_text(json.dumps({**line, "git_sha": "an older commit", "row": stale_plan}) + "\n")
    monkeypatch.setattr(plan_skeletons, "measured_code", lambda sha: "the same measured code")
    monkeypatch.setattr(plan_skeletons, "measure", lambda *a, **k: pytest.fail("a kept run must not run again"))
    assert plan_skeletons.main(args)["rows"] == first["rows"]  # the measurement kept, its plan the current one


def test_the_measured_code_leaves_out_the_planner(monkeypatch: pytest.MonkeyPatch) -> None:
    listing = "100644 blob aa\tsrc/arithmech/stages/identify.py\n"

    def ls_tree(planner_blob: str) -> str | None:
        out = listing + f"100644 blob {planner_blob}\tsrc/arithmech/plan/memory.py\n"
        monkeypatch.setattr(plan_skeletons.subprocess, "run", lambda *a, **k: SimpleNamespace(stdout=out))
        return plan_skeletons.measured_code("HEAD")

    assert ls_tree("bb") == ls_tree("cc") is not None
    monkeypatch.setattr(plan_skeletons.subprocess, "run",
                        lambda *a, **k: SimpleNamespace(stdout=listing.replace("aa", "dd")))  # fmt: skip
    assert plan_skeletons.measured_code("HEAD") != ls_tree("bb")


def test_plan_only_builds_no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_skeletons, "build_skeleton", lambda *a, **k: pytest.fail("no model in --plan-only"))
    metrics = plan_skeletons.main(["--plan-only", "--presets", "gemma2-9b", "--layers", "2", "--dtypes", "bfloat16"])
    assert [r["stage"] for r in metrics["rows"]] == [run.key for run in RUNS]
    assert all(r["status"] == "planned" and r["planned_peak_bytes"] > r["weights_bytes"] for r in metrics["rows"])


def test_measure_counts_tensors_above_the_start_and_the_widest_input() -> None:
    model = build_skeleton(skeleton_shape("mistral-7b", 2, quick=True), "float32")

    def call() -> torch.Tensor:
        kept = torch.ones(2**20)  # 4 MiB, alive through the forward pass
        model(input_ids=torch.ones(3, 17, dtype=torch.long))
        return kept

    _, measured = measured_peak.measure(call, model)
    assert measured.tensor_bytes >= 4 * 2**20 and measured.widest_tokens == 17 and measured.seconds > 0
    assert "allocator" in measured.how


def test_half_precision_against_float32_on_the_same_weights() -> None:
    metrics = skeleton_numerics.main(["--quick", "--presets", "qwen2.5-7b", "--layers", "2", "--prompts", "4"])
    assert [(r["dtype"], r["method"]) for r in metrics["rows"]] == [
        ("bfloat16", "identify"), ("bfloat16", "eap-ig"), ("float16", "identify"), ("float16", "eap-ig")
    ]  # fmt: skip
    assert metrics["nonfinite"] == 0 and metrics["min_top_agreement"] >= 0.9
    for row in metrics["rows"]:
        assert 0 < row["max_rel_diff"] < 0.2 and row["spearman"] > 0.95 and row["float16_headroom"] > 100


def test_numerics_measures_name_overflow_and_rank_changes() -> None:
    reference = torch.arange(40, dtype=torch.float32)
    same = skeleton_numerics.compare(reference.clone(), reference)
    assert same == {"max_rel_diff": 0.0, "spearman": pytest.approx(1.0), "top_agreement": 1.0, "nonfinite": 0}
    broken = reference.clone()
    broken[39] = float("inf")
    found = skeleton_numerics.compare(broken, reference)
    assert found["nonfinite"] == 1 and found["max_rel_diff"] == float("inf")
    reversed_ = skeleton_numerics.compare(reference.flip(0), reference)
    assert reversed_["spearman"] == pytest.approx(-1.0) and reversed_["top_agreement"] == 24 / 32


def test_fine_tuning_is_planned_at_its_widest_micro_batch_after_the_first_step() -> None:
    measured = SimpleNamespace(widths=(192, 140), widest_tokens=192)  # the first step has no AdamW moments yet
    by_key = {run.key: run for run in RUNS}
    assert plan_skeletons.planned_width(by_key["finetune-full"], measured) == 140
    assert plan_skeletons.planned_width(by_key["identify-path"], measured) == 192
    single = SimpleNamespace(widths=(192,), widest_tokens=192)
    assert plan_skeletons.planned_width(by_key["finetune-full"], single) == 192


def test_a_kept_run_that_another_reads_is_run_again_for_its_folder(tmp_path: Path) -> None:
    progress = tmp_path / "runs" / "progress.jsonl"
    base = [*QUICK, "--layers", "2", "--resume", str(progress)]
    plan_skeletons.main([*base, "--stages", "identify-path"])  # kept; its folder was a temporary one
    metrics = plan_skeletons.main([*base, "--stages", "finetune-precise"])
    assert metrics["runs_failed"] == 0 and metrics["runs_measured"] == 2  # identify-path again, then fine-tuning


def test_the_first_fine_tuning_step_is_planned_at_its_own_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first step's micro-batch is the skeletons' widest and runs before AdamW's moments and the anchors exist:
    the widths the benchmark reads from the data are those the model embedded, and the row's planned peak is
    that step's where it binds (precise SFT, whose optimizer state is small)."""
    calls: list[tuple[int, ...]] = []
    real = plan_skeletons.measure

    def spy(fn: object, model: object, device: str = "cpu") -> object:
        result, measured = real(fn, model, device)  # type: ignore[arg-type]
        calls.append(measured.widths)
        return result, measured

    monkeypatch.setattr(plan_skeletons, "measure", spy)
    metrics = plan_skeletons.main([*QUICK, "--layers", "2", "--stages", "finetune-precise"])
    run = next(r for r in RUNS if r.key == "finetune-precise")
    cfg = plan_skeletons.stage_config(run, "small")
    widths = plan_skeletons.finetune_widths(cfg)
    assert list(calls[-1]) == widths and widths[0] > max(widths[1:])
    row = metrics["rows"][-1]
    shape = skeleton_shape("llama3.1-8b", 2, quick=True)
    profile = plan_skeletons.device_profile(plan_skeletons.profile_for("cpu"))
    steady = plan_skeletons.plan_of(shape, run, cfg, "float32", profile, row["tokens"]).memory["single"].peak
    assert row["tokens"] == max(widths[1:]) and row["planned_peak_bytes"] > steady
