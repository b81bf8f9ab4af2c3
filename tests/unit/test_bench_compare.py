"""`make bench` comparison (benchmarks/compare.py), recording (benchmarks/record.py) and the docs' Performance
tables (benchmarks/readme_tables.py), without any model."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH_DIR) not in sys.path:  # the benchmark scripts are not a package; they import each other by name
    sys.path.insert(0, str(BENCH_DIR))

import compare  # noqa: E402
import readme_tables  # noqa: E402
import record  # noqa: E402
import speed_claims  # noqa: E402
import suite  # noqa: E402

MACHINE = {"cpu": "Test CPU", "logical_cores": 2, "torch": "2.13.0", "device": "cpu"}
OTHER_MACHINE = {**MACHINE, "cpu": "Other CPU"}
ARGS = {"prompts": 32, "sample": 8, "model": None, "device": "cpu"}
PATH_PATCHING = next(b for b in suite.BENCHMARKS if b.name == "path_patching")
KNOCKOUT = next(b for b in suite.BENCHMARKS if b.name == "knockout")


def entry(machine: dict[str, Any] = MACHINE, **metrics: Any) -> dict[str, Any]:
    """A path_patching results entry: 100x speedup, 10 s fast, 1000 s loop, agreeing to 1e-6 (the total variant:
    50x, 20 s, 1000 s, 1e-6), 3.7 and 4.6 forward passes of the prompts (1.9 and 2.3 padded), the loop 1.02 per
    component, 300 components, unless overridden."""
    base = {"speedup": 100.0, "fast_s": 10.0, "loop_s": 1000.0, "max_abs_diff": 1e-6, "path_passes": 1.9,
            "path_prompt_passes": 3.7, "total_speedup": 50.0, "total_s": 20.0, "total_loop_s": 1000.0,
            "total_max_abs_diff": 1e-6, "total_passes": 2.3, "total_prompt_passes": 4.6, "loop_prompt_passes": 1.02,
            "components": 300}  # fmt: skip
    return {"metrics": {**base, **metrics}, "args": ARGS, "machine": machine, "date": "2025-01-01", "git_sha": "abc"}


def verdicts(previous: dict[str, Any], now: dict[str, Any], machine: dict[str, Any] = MACHINE) -> dict[str, str]:
    rows = compare.compare(previous, now, [PATH_PATCHING], machine, tolerance=0.30)
    return {row.metric: row.verdict for row in rows}


def failed(previous: dict[str, Any], now: dict[str, Any], machine: dict[str, Any] = MACHINE) -> set[str]:
    return {r.metric for r in compare.compare(previous, now, [PATH_PATCHING], machine, tolerance=0.30) if r.failed}


def test_ratio_40_percent_lower_fails_10_percent_lower_passes() -> None:
    previous = {"path_patching": entry()}
    assert failed(previous, {"path_patching": entry(speedup=60.0)}) == {"speedup"}
    assert verdicts(previous, {"path_patching": entry(speedup=60.0)})["speedup"] == "FAIL: slower"
    assert failed(previous, {"path_patching": entry(speedup=90.0)}) == set()
    assert verdicts(previous, {"path_patching": entry(speedup=90.0)})["speedup"] == "ok"


def test_ratio_is_compared_across_machines() -> None:
    previous = {"path_patching": entry(machine=OTHER_MACHINE)}
    assert failed(previous, {"path_patching": entry(speedup=60.0)}) == {"speedup"}


def test_absolute_time_is_compared_only_on_the_same_machine() -> None:
    slower = {"path_patching": entry(fast_s=15.0)}  # 50% more time, same speedup
    assert failed({"path_patching": entry()}, slower) == {"fast_s"}
    other = verdicts({"path_patching": entry(machine=OTHER_MACHINE)}, slower)
    assert other["fast_s"] == "not compared: other machine"
    assert failed({"path_patching": entry(machine=OTHER_MACHINE)}, slower) == set()


def test_correctness_break_fails_even_when_faster() -> None:
    previous = {"path_patching": entry()}
    now = {"path_patching": entry(speedup=500.0, fast_s=2.0, max_abs_diff=1e-2)}
    rows = compare.compare(previous, now, [PATH_PATCHING], MACHINE, tolerance=0.30)
    assert [(r.metric, r.broken) for r in rows if r.failed] == [("max_abs_diff", True)]
    assert verdicts(previous, now)["speedup"] == "better"

    agree = {"metrics": {"speedup": 3.0, "batched_s": 1.0, "loop_s": 3.0, "accuracies_agree": False}, "args": ARGS}
    rows = compare.compare({}, {"knockout": agree}, [KNOCKOUT], MACHINE, tolerance=0.30)
    assert [r.metric for r in rows if r.broken] == ["accuracies_agree"]


def test_missing_previous_benchmark_or_metric_is_new_not_failed() -> None:
    first_run = verdicts({}, {"path_patching": entry()})
    checks = {"ok (must be <= 0.0001)", "ok (must be <= 5)", "ok (must be <= 6)", "ok (must be <= 1.1)",
              "ok (must be a positive whole number)"}  # fmt: skip
    assert set(first_run.values()) == {"new: no previous result", *checks}
    assert failed({}, {"path_patching": entry()}) == set()
    previous = entry()
    del previous["metrics"]["loop_s"]
    assert verdicts({"path_patching": previous}, {"path_patching": entry()})["loop_s"] == "new: no previous result"


def test_other_arguments_are_not_compared() -> None:
    previous = {"path_patching": {**entry(), "args": {**ARGS, "prompts": 64}}}
    assert verdicts(previous, {"path_patching": entry(speedup=10.0)})["speedup"] == "not compared: other arguments"


def test_a_metric_the_script_stopped_recording_fails() -> None:
    now = entry()
    del now["metrics"]["speedup"]
    assert failed({"path_patching": entry()}, {"path_patching": now}) == {"speedup"}


def test_table_and_sentence_name_the_regression() -> None:
    rows = compare.compare({"path_patching": entry()}, {"path_patching": entry(speedup=60.0)}, [PATH_PATCHING],
                           MACHINE, tolerance=0.30)  # fmt: skip
    table = compare.format_table(rows).splitlines()
    assert table[0].split() == ["benchmark", "metric", "previous", "now", "change", "verdict"]
    assert table[1].split() == ["path_patching", "speedup", "100", "60", "-40.0%", "FAIL:", "slower"]
    verdict_column = table[0].index("verdict")
    assert all(line[verdict_column - 1] == " " and line[verdict_column] != " " for line in table)
    sentence = compare.failure_sentence(rows, Path("benchmarks/results.json"), 30)
    assert "path_patching speedup (slower)" in sentence and "make bench-update" in sentence


@pytest.fixture
def fake_runs(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    """main() with every script replaced by the entry in the returned dict (no process, no model); a run at the
    full size records its arguments as {"size": "full"}."""
    runs = {"path_patching": {"metrics": entry()["metrics"], "args": ARGS, "wall_s": 1.0}}

    def run(bench: suite.Benchmark, device: str, size: suite.Size) -> dict[str, Any]:
        return {**runs[bench.name], **({"args": {"size": "full"}} if size == "full" else {})}

    monkeypatch.setattr(compare, "run_benchmark", run)
    monkeypatch.setattr(compare, "machine_fingerprint", lambda device: MACHINE)
    monkeypatch.setattr(compare, "git_sha", lambda: "abc")
    return runs


def test_update_writes_a_file_that_passes_against_itself(
    fake_runs: dict[str, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "results.json"
    assert compare.main(["--only", "path_patching", "--results", str(results)]) == 0
    assert "store these with `make bench-update`" in capsys.readouterr().out and not results.exists()

    assert compare.main(["--only", "path_patching", "--results", str(results), "--update"]) == 0
    stored = json.loads(results.read_text())["quick"]["path_patching"]
    assert stored["machine"] == MACHINE and stored["args"] == ARGS and stored["git_sha"] == "abc" and stored["date"]
    assert compare.main(["--only", "path_patching", "--results", str(results)]) == 0
    assert "no measurement is worse" in capsys.readouterr().out

    fake_runs["path_patching"] = {**fake_runs["path_patching"], "metrics": entry(speedup=60.0)["metrics"]}
    assert compare.main(["--only", "path_patching", "--results", str(results)]) == 1
    assert "path_patching speedup (slower)" in capsys.readouterr().out


def test_update_keeps_other_benchmarks_and_refuses_a_correctness_break(fake_runs: dict[str, dict[str, Any]],
                                                                       tmp_path: Path) -> None:  # fmt: skip
    results = tmp_path / "results.json"
    compare.write_results(results, {"quick": {"knockout": {"metrics": {"speedup": 1.4}, "args": {}}}, "full": {}})
    assert compare.main(["--only", "path_patching", "--results", str(results), "--update"]) == 0
    assert set((compare.load_results(results) or {})["quick"]) == {"knockout", "path_patching"}

    fake_runs["path_patching"] = {**fake_runs["path_patching"], "metrics": entry(max_abs_diff=0.5)["metrics"]}
    before = results.read_text()
    assert compare.main(["--only", "path_patching", "--results", str(results), "--update"]) == 1
    assert results.read_text() == before


def test_a_failing_script_is_reported_with_its_stderr(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("import sys\nsys.exit('model weights not found')\n")
    bench = suite.Benchmark("broken", (), {})
    with pytest.raises(compare.BenchmarkFailed, match="(?s)broken exited with status 1.*model weights not found"):
        compare.run_benchmark(bench, "cpu", bench_dir=tmp_path)


def test_run_benchmark_collects_what_the_script_records(tmp_path: Path) -> None:
    script = f"""import argparse, sys
sys.path.insert(0, {str(BENCH_DIR)!r})
from record import record
parser = argparse.ArgumentParser()
parser.add_argument("--prompts", type=int)
parser.add_argument("--device")
args = parser.parse_args()
print("speedup: 3.0x")
record("fake", args, {{"speedup": 3.0}})
"""
    (tmp_path / "fake.py").write_text(script)
    fake = suite.Benchmark("fake", ("--prompts", "4"), {}, full_args=("--prompts", "64"))
    result = compare.run_benchmark(fake, "cpu", bench_dir=tmp_path)
    assert result["metrics"] == {"speedup": 3.0} and result["args"] == {"prompts": 4, "device": "cpu"}
    assert result["command"] == "python benchmarks/fake.py --prompts 4 --device cpu"
    full = compare.run_benchmark(fake, "cpu", "full", bench_dir=tmp_path)
    assert full["args"] == {"prompts": 64, "device": "cpu"}
    assert full["command"] == "python benchmarks/fake.py --prompts 64 --device cpu"


def test_record_appends_a_line_only_when_the_variable_names_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "record.jsonl"
    args = argparse.Namespace(prompts=16)
    monkeypatch.delenv(record.RECORD_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    record.record("knockout", args, {"speedup": 1.5})
    assert list(tmp_path.iterdir()) == []

    monkeypatch.setenv(record.RECORD_ENV, str(target))
    record.record("knockout", args, {"speedup": 1.5})
    record.record("knockout", args, {"speedup": 1.6, "accuracies_agree": True})
    lines = [json.loads(line) for line in target.read_text().splitlines()]
    assert lines == [
        {"benchmark": "knockout", "metrics": {"speedup": 1.5}, "args": {"prompts": 16}},
        {"benchmark": "knockout", "metrics": {"speedup": 1.6, "accuracies_agree": True}, "args": {"prompts": 16}},
    ]


def test_full_update_stores_its_own_entries_and_keeps_the_quick_ones(
    fake_runs: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    results = tmp_path / "results.json"
    assert compare.main(["--only", "path_patching", "--results", str(results), "--update"]) == 0
    quick = json.loads(results.read_text())["quick"]
    assert compare.main(["--only", "path_patching", "--results", str(results), "--update", "--full"]) == 0
    stored = json.loads(results.read_text())
    assert stored["quick"] == quick and quick["path_patching"]["args"] == ARGS
    assert stored["full"]["path_patching"]["args"] == {"size": "full"} and stored["full"]["path_patching"]["date"]
    assert compare.main(["--only", "path_patching", "--results", str(results), "--full"]) == 0


def test_a_results_file_of_another_layout_is_refused(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"written_by": "benchmarks/compare.py --update", "benchmarks": {}}))
    with pytest.raises(SystemExit, match="not a results file"):
        compare.load_results(results)


def stamped(metrics: dict[str, Any], date: str = "2025-01-01", machine: dict[str, Any] = MACHINE) -> dict[str, Any]:
    return {"metrics": metrics, "args": {}, "command": "python benchmarks/x.py --n 1", "machine": machine,
            "date": date, "git_sha": "abcdef0123"}  # fmt: skip


def test_readme_table_rows_caption_and_missing_size() -> None:
    results = {
        "full": {},
        "quick": {
            "knockout": stamped({"speedup": 1.0938, "batched_s": 50.31, "loop_s": 55.04, "accuracies_agree": True}),
            "path_patching": stamped(entry()["metrics"], date="2025-02-02", machine=OTHER_MACHINE),
        },
    }
    section = readme_tables.render(results).splitlines()
    assert section[0] == readme_tables.BEGIN and section[-1] == readme_tables.END
    assert any(line.startswith("Full size") and line.endswith("nothing recorded yet.") for line in section)
    caption = next(line for line in section if line.startswith("Quick size"))
    assert "path_patching: 2025-02-02 on Other CPU, 2 logical cores, torch 2.13.0, cpu, git abcdef0" in caption
    assert "knockout: 2025-01-01 on Test CPU" in caption
    rows = [line for line in section if line.startswith("| ") and "`" in line and "benchmarks/x.py" in line]
    loop = "(the loop 1.02 per component)"
    padded = "of the right-padded prompts with logits at every position (counted) |"
    path, total = (f"max \\|fast - loop\\| 1.0e-06; {n} forward passes of the prompts {loop}, {p} {padded}"
                   for n, p in (("3.70", "1.90"), ("4.60", "2.30")))  # fmt: skip
    assert [row.split(" | ")[2:] for row in rows] == [  # suite order, not the file's
        ["10.0 s", "1,000 s", "**100.0x**", path],
        ["20.0 s", "1,000 s", "**50.0x**", total],
        ["50.3 s", "55.0 s", "**1.09x**", "accuracies identical |"],
    ]
    assert rows[0].split(" | ")[0].endswith("both in the engine's length chunks (sampled, scaled)")


def test_rows_an_older_entry_lacks_are_left_out() -> None:
    """An entry recorded before the total variant's metrics existed shows its path row only, without a count."""
    counts = ("path_passes", "path_prompt_passes", "loop_prompt_passes")
    older = {k: v for k, v in entry()["metrics"].items() if not k.startswith("total") and k not in counts}
    section = readme_tables.table("quick", {"path_patching": stamped(older)})
    rows = [line for line in section.splitlines() if "benchmarks/x.py" in line]
    assert len(rows) == 1 and rows[0].endswith("max \\|fast - loop\\| 1.0e-06 |")


def test_an_entry_before_the_prompt_unit_and_the_chunked_loop_is_labelled() -> None:
    """Recorded with the padded count only and the loop on the right-padded batch: the row says both, and shows
    no count in forward passes of the prompts."""
    older = {k: v for k, v in entry()["metrics"].items()
             if k not in ("path_prompt_passes", "total_prompt_passes", "loop_prompt_passes", "components")}  # fmt: skip
    rows = [line for line in readme_tables.table("full", {"path_patching": stamped(older)}).splitlines()
            if "benchmarks/x.py" in line]  # fmt: skip
    assert len(rows) == 2
    assert "the loop on the right-padded batch (sampled, scaled; recorded before" in rows[0]
    assert rows[0].endswith("1.0e-06; not measured yet in forward passes of the prompts, 1.90 of the right-padded "
                            "prompts with logits at every position (counted) |")  # fmt: skip
    paragraph = speed_claims.speed_paragraph({"path_patching": stamped(older)})
    assert "what every head and MLP cost is not measured yet" in paragraph
    assert "their time ratio is not measured yet" in paragraph and "100" not in paragraph


def set_metrics(name: str, tokens: float, tl: float, nnsight: float) -> dict[str, Any]:
    """peers.py's metrics of one prompt set: arithmech total 12 s (10-14), TransformerLens 2.8 s per head and
    nnsight 2.5 s (each with a spread), ratios `tl` and `nnsight` (with a spread of 10 each way)."""
    m: dict[str, Any] = {
        "prompts": 64, "tokens": tokens, "padded_width": 70, "prompt_forward_s": 2.0, "total_s": 12.0,
        "total_s_min": 10.0, "total_s_max": 14.0, "total_prompt_passes": 4.57, "total_passes": 2.32, "path_s": 10.0,
        "path_prompt_passes": 3.71, "path_passes": 1.88, "tl_s_per_head": 2.8, "tl_s_per_head_min": 2.6,
        "tl_s_per_head_max": 3.0, "tl_prompt_passes_per_head": 1.26, "tl_max_abs_diff": 6e-7, "total_vs_tl": tl,
        "total_vs_tl_min": tl - 10, "total_vs_tl_max": tl + 10, "nnsight_s_per_head": 2.5,
        "nnsight_s_per_head_min": 2.4, "nnsight_s_per_head_max": 2.7, "nnsight_prompt_passes_per_head": 2.15,
        "nnsight_max_abs_diff": 5e-7, "total_vs_nnsight": nnsight, "total_vs_nnsight_min": nnsight - 10,
        "total_vs_nnsight_max": nnsight + 10,
    }  # fmt: skip
    return {f"{name}_{key}": value for key, value in m.items()}


PEERS_METRICS = {"components": 300, "repeats": 3, **set_metrics("short", 31.2, 60.0, 55.0),
                 **set_metrics("default", 45.3, 70.0, 62.5)}  # fmt: skip
LEGACY_PEERS = {
    "plain_forward_s": 2.5, "components": 300, "total_s": 12.0, "total_passes": 4.7, "path_s": 10.0,
    "path_passes": 3.8, "tl_s_per_head": 2.8, "tl_max_abs_diff": 6e-7, "total_vs_tl": 70.0,
    "nnsight_s_per_head": 2.5, "nnsight_max_abs_diff": 5e-7, "total_vs_nnsight": 62.5,
}  # fmt: skip
"""An entry of peers.py from before the repetitions: one timing per side, one prompt set."""


def test_peers_table_gives_medians_with_their_spread_per_prompt_set() -> None:
    results = {"full": {"peers": stamped(PEERS_METRICS)}, "quick": {}}
    lines = readme_tables.render(results).splitlines()
    caption = next(line for line in lines if line.startswith("Side by side") and "full size" in line)
    assert "(`python benchmarks/x.py --n 1`); measured 2025-01-01 on Test CPU" in caption
    assert "median of 3 interleaved repetitions" in caption
    start = lines.index(caption) + 2
    rows = lines[start : lines.index("", start) if "" in lines[start:] else None]
    rows = [row for row in rows if row.startswith("|") and not row.startswith("|---")]
    assert rows[0] == (
        "| | short prompts (2 solved examples): 31.2 tokens a prompt on average, 64 pairs (70 padded) | the default "
        "prompts (3 solved examples): 45.3 tokens a prompt on average, 64 pairs (70 padded) |"
    )
    assert rows[1] == (
        "| TransformerLens (TransformerBridge, `get_act_patch_attn_head_out_by_pos`) | 2.80 s (2.60-3.00) per head: "
        "1.40 forward passes by time, 1.26 counted; max \\|difference\\| to arithmech 6.0e-07 | 2.80 s (2.60-3.00) per "
        "head: 1.40 forward passes by time, 1.26 counted; max \\|difference\\| to arithmech 6.0e-07 |"
    )
    assert rows[4] == (
        "| arithmech `--variant total`, all 300 components | 12.0 s (10.0-14.0); 4.57 forward passes of the prompts, "
        "2.32 padded | 12.0 s (10.0-14.0); 4.57 forward passes of the prompts, 2.32 padded |"
    )
    assert rows[-2:] == [
        "| arithmech `--variant total` against TransformerLens: time ratio on all 300 components | **60x (50-70)** | "
        "**70x (60-80)** |",
        "| arithmech `--variant total` against nnsight: time ratio on all 300 components | **55x (45-65)** | "
        "**62x (52-72)** |",
    ]
    assert any(line.startswith("Side by side") and "quick size: nothing recorded yet" in line for line in lines)


def test_peers_table_says_not_measured_for_a_missing_set_or_peer() -> None:
    only_default = {k: v for k, v in PEERS_METRICS.items() if not k.startswith("short_")}
    only_nnsight = {k: v for k, v in only_default.items() if "_tl" not in k}
    table = speed_claims.peers_table("quick", stamped(only_nnsight), "measured then")
    assert "| short prompts: not measured yet | the default prompts (3 solved examples)" in table
    assert "TransformerLens (" not in table and "| **62x (52-72)** |" in table
    assert "| arithmech `--variant total`, all 300 components | not measured yet | 12.0 s" in table


def test_a_peers_entry_of_single_timings_is_left_out_and_said_so() -> None:
    section = readme_tables.render({"full": {"peers": stamped(LEGACY_PEERS)}, "quick": {}})
    line = next(line for line in section.splitlines() if "full size" in line and line.startswith("Side by side"))
    assert line.startswith("Side by side with TransformerLens and nnsight, full size: not measured yet in repeated "
                           "timings. The stored entry (2025-01-01, git abcdef0")  # fmt: skip
    assert "70.0" not in section and "62.5" not in section and "**70" not in section


def test_readme_paragraph_states_the_medians_and_that_the_comparison_is_algorithmic() -> None:
    full = {"path_patching": stamped(entry(speedup=80.4, total_speedup=64.3)["metrics"]),
            "peers": stamped(PEERS_METRICS)}  # fmt: skip
    text = speed_claims.speed_paragraph(full)
    assert "all 300 heads and MLPs cost 3.7 (4.6 for activation patching)" in text
    assert "they take 64-80x less time on a 2-core CPU" in text
    assert ("as the median of 3 interleaved repetitions: 70x (TransformerLens) and 62x (nnsight) less time on the "
            "default prompts (45 tokens a prompt); 60x (TransformerLens) and 55x (nnsight) less time on short "
            "prompts (31 tokens a prompt)") in text  # fmt: skip
    assert "The comparison is algorithmic: cached last-token recomputation against one full pass per component" in text
    assert "not measured yet" not in text
    legacy = speed_claims.speed_paragraph({"peers": stamped(LEGACY_PEERS)})
    assert "not measured yet on the default prompts (3 solved examples); not measured yet on short prompts" in legacy
    assert "70" not in legacy and "all 300 heads and MLPs" in legacy
    wrapped = readme_tables.render_readme({"full": full, "quick": {}}).splitlines()
    assert wrapped[0] == readme_tables.README_BEGIN and wrapped[-1] == readme_tables.README_END
    assert all(len(line) <= 120 for line in wrapped[2:-1])


def test_every_benchmark_of_the_suite_has_a_readme_row() -> None:
    assert set(readme_tables.SHOWN) | {readme_tables.PEERS} | set(readme_tables.ELSEWHERE) == {
        b.name for b in suite.BENCHMARKS
    }


def test_benchmarks_of_a_missing_extra_are_left_out(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """`make bench` without TransformerLens and nnsight runs the others and says how to add peers."""
    monkeypatch.setattr(suite.importlib.util, "find_spec", lambda name: None)
    names = [b.name for b in compare.select(None, "cpu")]
    assert "peers" not in names and "path_patching" in names
    assert 'peers left out: transformer_lens, nnsight not installed (pip install "arithmech[peers]")' in (
        capsys.readouterr().out
    )
    with pytest.raises(SystemExit, match="peers needs transformer_lens, nnsight"):
        compare.select("peers", "cpu")


def test_performance_section_is_replaced_between_the_markers_only(tmp_path: Path) -> None:
    page = tmp_path / "performance.md"
    page.write_text(f"# Title\n\n{readme_tables.BEGIN}\nstale 107.7x\n{readme_tables.END}\n\nafter\n")
    results = tmp_path / "results.json"
    compare.write_results(results, {"full": {}, "quick": {"knockout": stamped({
        "speedup": 1.5, "batched_s": 2.0, "loop_s": 3.0, "accuracies_agree": True})}})  # fmt: skip
    readme = tmp_path / "README.md"
    readme.write_text(f"{readme_tables.README_BEGIN}\n{readme_tables.README_END}\n")
    args = ["--results", str(results), "--page", str(page), "--readme", str(readme)]
    assert readme_tables.main([*args, "--check"]) == 1
    assert readme_tables.main([*args, "--write"]) == 0 and readme_tables.main([*args, "--check"]) == 0
    text = page.read_text()
    assert text.startswith("# Title\n\n<!-- bench:begin -->") and text.endswith("<!-- bench:end -->\n\nafter\n")
    assert "107.7x" not in text and "**1.50x**" in text
    with pytest.raises(ValueError, match="bench:begin"):
        readme_tables.replace_section("no markers", "section")


def test_a_hand_edit_of_the_readme_paragraph_fails_the_check(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    compare.write_results(results, {"full": {"peers": stamped(PEERS_METRICS)}, "quick": {}})
    page, readme = tmp_path / "performance.md", tmp_path / "README.md"
    page.write_text(f"{readme_tables.BEGIN}\n{readme_tables.END}\n")
    readme.write_text(f"# arithmech\n\n{readme_tables.README_BEGIN}\n{readme_tables.README_END}\n\n## Next\n")
    args = ["--results", str(results), "--page", str(page), "--readme", str(readme)]
    assert readme_tables.main([*args, "--write"]) == 0 and readme_tables.main([*args, "--check"]) == 0
    text = readme.read_text()
    assert text.startswith("# arithmech\n\n<!-- speed:begin -->") and text.endswith("<!-- speed:end -->\n\n## Next\n")
    assert "70x (TransformerLens)" in text
    readme.write_text(text.replace("70x (TransformerLens)", "150x (TransformerLens)"))
    assert readme_tables.main([*args, "--check"]) == 1


def test_performance_page_tables_are_what_results_json_renders() -> None:
    """docs/performance.md and the README's speed paragraph quote no benchmark number that benchmarks/results.json
    does not hold (make bench-update and make bench-full-update re-render them)."""
    assert readme_tables.main(["--check"]) == 0, (
        "run `python benchmarks/readme_tables.py --write` and commit docs/performance.md and README.md"
    )


def test_on_demand_benchmarks_run_only_when_named() -> None:
    """The skeletons take hours at full size: `make bench` leaves them out, `--only` runs them."""
    default = [b.name for b in compare.select(None, "cpu")]
    assert "plan_skeletons" not in default and "skeleton_numerics" not in default and "knockout" in default
    assert [b.name for b in compare.select("plan_skeletons", "cpu")] == ["plan_skeletons"]


def test_a_recorded_table_shows_as_its_row_count() -> None:
    bench = next(b for b in suite.BENCHMARKS if b.name == "plan_skeletons")
    row = compare.compare_metric(bench, "rows", [{"stage": "knockout"}] * 3, None, {"args": {}}, {}, 0.3)
    assert row.verdict == "ok (must be a list of rows)"
    assert compare.format_table([row]).splitlines()[1].split()[3] == "3"


def test_a_gpu_row_shows_the_plan_beside_the_measurement() -> None:
    """gpu_scan.py and gpu_finetune.py record the plan of what they timed; their rows show it, older entries not."""
    scan = {"fast_s": 2.0, "speedup": 50.0, "prompts_per_s": 128.0, "peak_memory_gib": 14.2, "max_abs_diff": 1e-3,
            "planned_gib": 1.2, "measured_gib": 1.1, "estimated_s": 1.5}  # fmt: skip
    tune = {"precise_s_per_step": 1.0, "full_s_per_step": 3.0, "speedup": 3.0, "precise_peak_gib": 20.0,
            "full_peak_gib": 90.0, "precise_planned_gib": 6.5, "precise_measured_gib": 6.0, "full_planned_gib": 77.0,
            "full_measured_gib": 76.0}  # fmt: skip
    section = readme_tables.table("full", {"gpu_scan": stamped(scan), "gpu_finetune": stamped(tune)})
    assert "; planned 1.20 GiB above the weights, measured 1.10 GiB |" in section
    assert "; precise: planned 6.50 GiB above the weights, measured 6.00 GiB; full: planned 77.00 GiB" in section
    older = {k: v for k, v in scan.items() if k not in ("planned_gib", "measured_gib", "estimated_s")}
    assert "planned" not in readme_tables.table("full", {"gpu_scan": stamped(older)}).split("|")[-2]
