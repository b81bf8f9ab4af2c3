"""Scans sharded over two CPU processes give the numbers of one process; so does the pipeline's finetune.

identify (path patching), knockout and mediate run once in this process and once under
`accelerate launch --multi_gpu --num_processes 2 -m arithmech.cli ...` with CUDA hidden (accelerate's `--cpu`
launcher starts a single process unless mpirun is used, so the multi-process launcher is the one that gives two
CPU processes here; they join over gloo). The two run folders' CSVs must agree to 1e-6. The prompts carry the
tiny model's own answers, so knockout accuracies are neither all 0 nor all 1 and their merge is exercised.
The split itself (`shard_bounds`) is checked for every small size, world size and chunk size.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from arithmech import distributed
from arithmech.cli import main
from arithmech.data import GenerationConfig, generate_pairs, tokenize_pairs, write_prompt_file
from arithmech.models.load import ModelConfig, load_model

pytestmark = pytest.mark.usefixtures("one_thread")

ACCELERATE = Path(sys.executable).with_name("accelerate")
TOL = 1e-6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_two(args: list[str], timeout: int = 300) -> str:
    """`accelerate launch` two CPU processes of `python -m arithmech.cli ARGS`; returns their output."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "ACCELERATE_USE_CPU": "true"}
    cmd = [str(ACCELERATE), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
           "-m", "arithmech.cli", *args]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    return output


def numeric_rows(path: Path) -> list[dict[str, object]]:
    """CSV rows with every number parsed (NaN kept), so two files compare to a tolerance."""

    def value(text: str) -> object:
        try:
            return float(text)
        except ValueError:
            return text

    with path.open() as handle:
        return [{k: value(v) for k, v in row.items()} for row in csv.DictReader(handle)]


def assert_same_numbers(one: Path, two: Path) -> None:
    a, b = numeric_rows(one), numeric_rows(two)
    assert len(a) == len(b) > 0, one.name
    for row_a, row_b in zip(a, b, strict=True):
        assert row_a.keys() == row_b.keys()
        for key, x in row_a.items():
            y = row_b[key]
            if isinstance(x, float) and isinstance(y, float):
                assert (x != x and y != y) or abs(x - y) <= TOL, (one.name, row_a, row_b)  # NaN == NaN here
            else:
                assert x == y, (one.name, key, row_a, row_b)


@pytest.fixture(scope="module")
def model(tiny_model_dir) -> Path:
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def prompts(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """11 addition prompts whose answer is the tiny model's own top token (printable), so it answers them all."""
    handle = load_model(ModelConfig(model=str(model)))
    pairs = generate_pairs(GenerationConfig(operations=("addition",), formations=("equation",), n_per_template=16))
    t, _ = tokenize_pairs(handle.tokenizer, pairs)
    with torch.no_grad():
        top = handle.view.end_logits(t.ref_ids, t.ref_mask, t.end).argmax(-1).tolist()
    answers = [handle.tokenizer.decode([tok]) for tok in top]
    own = [  # a whole printable token; a byte of a multi-byte character decodes to "\ufffd", which is no answer
        dataclasses.replace(p, answer=a)
        for p, a in zip(t.pairs, answers, strict=True)
        if a.strip() == a != "" and a.isascii() and a.isprintable()
    ]
    assert len(own) >= 11
    path = tmp_path_factory.mktemp("prompts") / "own.jsonl"
    write_prompt_file(path, own[:11])  # 11 prompts: uneven shards over two processes
    write_prompt_file(path.parent / "own_all.jsonl", own)  # for a run that leaves prompts to hold out
    return path


@pytest.fixture(scope="module")
def identify_one(model: Path, prompts: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("one") / "identify"
    assert main(identify_args(model, prompts, out)) == 0
    return out


def identify_args(model: Path, prompts: Path, out: Path) -> list[str]:
    # batch size 4: 3 chunks, split 1 + 2 at a chunk boundary
    return ["identify", "--model", str(model), "--prompts", str(prompts), "--batch-size", "4", "--out", str(out),
            "--quiet"]  # fmt: skip


def test_shards_cover_the_items_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    for n, world, unit in [(n, w, u) for n in range(14) for w in range(1, 5) for u in (1, 3, 4)]:
        monkeypatch.setattr(distributed, "world_size", lambda world=world: world)
        bounds = []
        for r in range(world):
            monkeypatch.setattr(distributed, "rank", lambda r=r: r)
            bounds.append(distributed.shard_bounds(n, unit))
        case = (n, world, unit, bounds)
        assert bounds[0][0] == 0 and bounds[-1][1] == n, case
        assert all(hi == lo for (_, hi), (lo, _) in zip(bounds, bounds[1:], strict=False)), case  # contiguous
        assert all(lo <= hi and (lo % unit == 0 or lo == n) for lo, hi in bounds), case  # cut at chunk boundaries
        chunks = [-(-(hi - lo) // unit) for lo, hi in bounds]
        assert max(chunks) - min(chunks) <= 1, case  # balanced in chunks


def test_one_process_is_a_no_op() -> None:
    code = (
        "import sys; from arithmech import distributed as d; "
        "assert (d.world_size(), d.rank(), d.is_main(), d.shard_bounds(7, 3)) == (1, 0, True, (0, 7)); "
        "assert d.gather([1, 2]) == [1, 2] and d.shard('abc') == 'abc'; d.barrier(); d.check_same('x', 1); "
        "assert 'accelerate' not in sys.modules and 'torch' not in sys.modules, 'imported a heavy module'"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_launch_waits_hours_at_barriers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 may run an unsharded stage for hours while the others wait: the process group must not time out."""
    import datetime

    import accelerate

    seen: dict[str, object] = {}

    class RecordingState:
        num_processes = 2

        def __init__(self, cpu: bool, **kwargs: object) -> None:
            seen.update(kwargs)

    monkeypatch.setattr(accelerate, "PartialState", RecordingState)
    monkeypatch.setenv("WORLD_SIZE", "2")
    distributed._state.cache_clear()
    try:
        distributed._state()
    finally:
        distributed._state.cache_clear()
    assert isinstance(seen.get("timeout"), datetime.timedelta) and seen["timeout"] >= datetime.timedelta(hours=24)


@pytest.mark.slow
def test_identify_two_processes(model: Path, prompts: Path, identify_one: Path, tmp_path: Path) -> None:
    two = tmp_path / "identify"
    output = launch_two(identify_args(model, prompts, two))
    assert output.count("top heads:") == 1  # only rank 0 prints
    assert_same_numbers(identify_one / "effects.csv", two / "effects.csv")
    for name in ("prompts.jsonl", "key_components.json", "template_accuracy.csv"):
        assert (identify_one / name).read_text() == (two / name).read_text(), name
    assert not (two / ".partial").exists()


@pytest.mark.slow
def test_knockout_two_processes(model: Path, identify_one: Path, tmp_path: Path) -> None:
    args = ["knockout", "--model", str(model), "--from", str(identify_one), "--max-k", "4", "--n-random", "2",
            "--batch-size", "8", "--quiet"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    launch_two([*args, "--out", str(tmp_path / "two")])
    one = numeric_rows(tmp_path / "one" / "knockout.csv")
    assert one[0]["accuracy"] == 1.0 and 0 < min(float(r["accuracy"]) for r in one) < 1  # a real merge of counts
    assert_same_numbers(tmp_path / "one" / "knockout.csv", tmp_path / "two" / "knockout.csv")
    assert_same_numbers(tmp_path / "one" / "knockout_summary.csv", tmp_path / "two" / "knockout_summary.csv")


@pytest.mark.slow
def test_knockout_held_out_two_processes(model: Path, prompts: Path, tmp_path: Path) -> None:
    """A run of 7 of the file's prompts leaves others of fresh facts: both prompt sets are sharded and merged."""
    run = tmp_path / "identify"
    assert main(["identify", "--model", str(model), "--prompts", str(prompts.parent / "own_all.jsonl"),
                 "--max-prompts", "7", "--out", str(run), "--quiet"]) == 0  # fmt: skip
    args = ["knockout", "--model", str(model), "--from", str(run), "--max-k", "2", "--n-random", "2",
            "--batch-size", "8", "--quiet"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    launch_two([*args, "--out", str(tmp_path / "two")])
    counts = json.loads((tmp_path / "one" / "metadata.json").read_text())["counts"]["prompts"]
    assert counts["in_sample"] == 7 and counts["held_out"] >= 3
    one = numeric_rows(tmp_path / "one" / "knockout.csv")
    assert [r["prompt_set"] for r in one][:: len(one) // 2] == ["held_out", "in_sample"]
    for name in ("knockout.csv", "knockout_summary.csv", "prompts_held_out.jsonl"):
        if name.endswith(".jsonl"):
            assert (tmp_path / "one" / name).read_text() == (tmp_path / "two" / name).read_text()
        else:
            assert_same_numbers(tmp_path / "one" / name, tmp_path / "two" / name)


@pytest.mark.slow
def test_knockout_of_answer_digits_two_processes(model: Path, tmp_path: Path) -> None:
    """Answers of 1 to 3 tokens, so the two processes hold different answer places and carry groups; a pair's
    tokens stay in one process. Merged per (place, group) in one process's order."""
    rows = [{"reference": f"9+1=10\n{a}+{b}=", "counterfactual": f"9+1=10\n{a}&{b}=", "answer": str(a + b),
             "operation": "addition", "a": a, "b": b}
            for a, b in [(3, 4), (2, 5), (1, 1), (27, 15), (21, 15), (95, 17), (40, 52)]]  # fmt: skip
    prompts = tmp_path / "digits.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "identify"
    assert main(["identify", "--model", str(model), "--prompts", str(prompts), "--answer-digits",
                 "--keep-incorrect", "--out", str(run), "--quiet"]) == 0  # fmt: skip
    args = ["knockout", "--model", str(model), "--from", str(run), "--max-k", "2", "--n-random", "1",
            "--min-group-size", "2", "--batch-size", "8", "--quiet"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    launch_two([*args, "--out", str(tmp_path / "two")])
    for name in ("knockout.csv", "knockout_by_place.csv", "knockout_place_summary.csv"):
        assert_same_numbers(tmp_path / "one" / name, tmp_path / "two" / name)


@pytest.mark.slow
def test_mediate_two_processes(model: Path, tmp_path: Path) -> None:
    # 2 pairs per task, of different formats and lengths: one per process, merged with padding
    args = ["mediate", "--model", str(model), "--tasks", "addition,retrieval", "--n-pairs", "2", "--few-shot", "0",
            "--neuron-k", "5", "--quiet"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    launch_two([*args, "--out", str(tmp_path / "two")])
    for name in ("mediation_by_class.csv", "mediation_total.csv", "neuron_top.csv", "neuron_overlap.csv"):
        assert_same_numbers(tmp_path / "one" / name, tmp_path / "two" / name)
    pairs = (tmp_path / "one" / "pairs.jsonl").read_text()
    assert pairs == (tmp_path / "two" / "pairs.jsonl").read_text()
    addition = [json.loads(line)["base"] for line in pairs.splitlines()][:2]
    assert len(addition[0]) != len(addition[1])  # the shards' per-position tables have different widths


@pytest.mark.slow
def test_pipeline_finetune_runs_in_both_processes(model: Path, identify_one: Path, tmp_path: Path) -> None:
    """`arithmech run` with finetune under a two-process launch: every process trains (data parallel), none
    waits at a barrier while the other calls collectives, and the delta is the one of a single process."""
    from safetensors.torch import load_file

    rows = [{"id": f"r{i}", "question": f"Tom has {i % 7} apples and buys {i % 5} more. How many now?",
             "answer": str(i % 7 + i % 5)} for i in range(16)]  # fmt: skip
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps({
        "model": {"model": str(model)}, "stages": ["finetune"],
        "finetune": {"method": "precise", "components": ["0.1", "1.2"], "data": str(data), "target": "answer",
                     "batch_size": 8, "micro_batch_size": 2, "max_steps": 2, "lr": 1e-4, "warmup_ratio": 0.0},
    }))  # fmt: skip
    for run in ("one", "two"):
        (tmp_path / run).mkdir()
        (tmp_path / run / "identify").symlink_to(identify_one)  # the stage it needs, already done
    assert main(["run", "--config", str(config), "--out", str(tmp_path / "one"), "--quiet"]) == 0
    launch_two(["run", "--config", str(config), "--out", str(tmp_path / "two"), "--quiet"], timeout=180)
    meta = json.loads((tmp_path / "two" / "finetune" / "metadata.json").read_text())
    assert meta["distributed"] == {"type": "MULTI_CPU", "processes": 2}
    one, two = (load_file(tmp_path / run / "finetune" / "delta.safetensors") for run in ("one", "two"))
    assert one.keys() == two.keys()
    for key in one:
        torch.testing.assert_close(one[key], two[key], rtol=0, atol=1e-6)
