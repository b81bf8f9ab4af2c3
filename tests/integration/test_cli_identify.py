"""`arithmech identify` end to end on a tiny saved model, and every bad input it must explain in one line."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from arithmech.cli import main

CANDIDATES = [
    "1 + 2 = ",
    "Q: 3 plus 4? A: ",
    "5+1 = ",
    "The sum of 2 and 2 is ",
    "7 + 1 = ",
    "Q: 1 plus 1? A: ",
    "4+4 = ",
    "The sum of 3 and 5 is ",
    "2 + 6 = ",
    "9+0 = ",
]


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def model_answers(model_dir: Path, prompts: list[str]) -> list[str]:
    """The tiny model's own top next token for each prompt (as text), so a test can make it right or wrong."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager")
    out = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            top = int(model(ids).logits[0, -1].argmax())
        out.append(tokenizer.decode(top) if 33 <= top <= 126 else "")  # printable ASCII round-trips
    return out


@pytest.fixture(scope="module")
def llama_dir(tiny_model_dir) -> Path:
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def queries(llama_dir: Path) -> list[str]:
    """Prompts whose top token is printable, so the model answers them when told its own answer."""
    answers = model_answers(llama_dir, CANDIDATES)
    chosen = [q for q, a in zip(CANDIDATES, answers, strict=True) if a][:4]
    assert len(chosen) >= 3
    return chosen


def operator_swap(prompt: str) -> str:
    for op, cf in (("plus", "xxxx"), ("+", "@"), ("sum", "zzz")):
        if op in prompt:
            return prompt.replace(op, cf, 1)
    raise AssertionError(prompt)


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def good_prompts(llama_dir: Path, queries: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    answers = model_answers(llama_dir, queries)
    rows = [
        {"reference": q, "counterfactual": operator_swap(q), "answer": a, "note": f"row {i}"}
        for i, (q, a) in enumerate(zip(queries, answers, strict=True))
    ]
    return write_jsonl(tmp_path_factory.mktemp("prompts") / "good.jsonl", rows)


def test_identify_writes_run_folder(
    llama_dir: Path, good_prompts: Path, queries: list[str], tmp_path: Path, capsys
) -> None:
    out = tmp_path / "run"
    code, stdout, stderr = run_cli(
        ["identify", "--model", str(llama_dir), "--prompts", str(good_prompts), "--out", str(out), "--quiet"],
        capsys,
    )
    assert code == 0, stderr
    assert "top heads:" in stdout and str(out) in stdout
    names = {p.name for p in out.iterdir()}
    assert {
        "effects.csv",
        "key_components.json",
        "effects_heatmap.png",
        "prompts.jsonl",
        "metadata.json",
        "template_accuracy.csv",
    } <= names
    assert ".partial" not in names
    rows = list(csv.DictReader((out / "effects.csv").open()))
    config = json.loads((llama_dir / "config.json").read_text())
    n_layers, n_heads = config["num_hidden_layers"], config["num_attention_heads"]
    assert len(rows) == n_layers * (n_heads + 1)
    assert rows[0]["component"] == "0.0" and rows[n_heads]["component"] == "mlp.0"
    assert rows[n_heads]["head"] == "" and rows[n_heads]["kind"] == "mlp"
    assert {"component", "layer", "head", "kind", "effect", "fraction_of_total"} <= set(rows[0])
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["counts"]["used"] == len(queries)
    assert metadata["config"]["variant"] == "path" and "torch" in metadata["versions"]
    kept = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    assert kept[0]["note"] == "row 0"  # extra fields survive
    assert (out / "effects_heatmap.png").read_bytes()[:4] == b"\x89PNG"
    (accuracy,) = list(csv.DictReader((out / "template_accuracy.csv").open()))
    assert accuracy["template_id"] == "custom"
    assert int(accuracy["pairs"]) == int(accuracy["kept"]) == int(accuracy["correct"]) == len(queries)
    assert float(accuracy["accuracy"]) == 1.0


def test_mismatched_pairs_are_rejected_and_counted(llama_dir: Path, good_prompts: Path, tmp_path: Path, capsys) -> None:
    rows = good_prompts.read_text().splitlines()
    bad = json.dumps({"reference": "1 + 1 = ", "counterfactual": "1 plus 1 = ", "answer": "2"})
    prompts = tmp_path / "mixed.jsonl"
    prompts.write_text("\n".join([*rows, bad]) + "\n")
    out = tmp_path / "run"
    args = ["identify", "--model", str(llama_dir), "--prompts", str(prompts), "--out", str(out), "--quiet"]
    code, _, stderr = run_cli(args, capsys)
    assert code == 0, stderr
    (accuracy,) = list(csv.DictReader((out / "template_accuracy.csv").open()))
    assert (int(accuracy["pairs"]), int(accuracy["rejected_length_mismatch"])) == (len(rows) + 1, 1)
    assert json.loads((out / "metadata.json").read_text())["counts"]["rejected_length_mismatch"] == 1


def test_same_seed_same_numbers(llama_dir: Path, good_prompts: Path, tmp_path: Path, capsys) -> None:
    for name in ("a", "b"):
        args = ["identify", "--model", str(llama_dir), "--prompts", str(good_prompts)]
        args += ["--out", str(tmp_path / name)]
        assert run_cli([*args, "--quiet"], capsys)[0] == 0
    assert (tmp_path / "a" / "effects.csv").read_text() == (tmp_path / "b" / "effects.csv").read_text()


def test_resume_uses_saved_chunks(llama_dir: Path, good_prompts: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    import arithmech.patching.path as path_module

    out = tmp_path / "run"
    args = [
        "identify",
        "--model",
        str(llama_dir),
        "--prompts",
        str(good_prompts),
        "--out",
        str(out),
        "--batch-size",
        "2",
        "--quiet",
    ]
    real_chunk = path_module._patch_chunk
    calls = {"n": 0}

    def interrupted_after_one(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real_chunk(*a, **k)

    monkeypatch.setattr(path_module, "_patch_chunk", interrupted_after_one)
    assert run_cli(args, capsys)[0] == 130
    assert not (out / "metadata.json").exists() and not (out / "effects.csv").exists()
    assert len(list(out.glob(".partial/*/chunk-*.pt"))) == 1
    calls["n"] = 10
    assert run_cli(args, capsys)[0] == 0
    resumed = calls["n"] - 10  # chunks the resumed run computed
    fresh = tmp_path / "fresh"
    calls["n"] = 10
    assert run_cli([*args[:-5], "--out", str(fresh), "--batch-size", "2", "--quiet"], capsys)[0] == 0
    assert calls["n"] - 10 >= 2 and resumed == calls["n"] - 10 - 1  # only the missing chunks were computed
    assert (out / "effects.csv").read_text() == (fresh / "effects.csv").read_text()


def test_resume_does_not_reuse_chunks_of_another_engine_version(
    llama_dir: Path, good_prompts: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    """A rerun after the code changed (a fixed engine) computes every chunk anew; the same code reuses them."""
    import arithmech.patching.path as path_module

    out = tmp_path / "run"
    args = ["identify", "--model", str(llama_dir), "--prompts", str(good_prompts), "--out", str(out),
            "--batch-size", "2", "--quiet"]  # fmt: skip
    real_chunk = path_module._patch_chunk
    calls = {"n": 0, "stop_at": 2}

    def counted(*a, **k):
        calls["n"] += 1
        if calls["n"] == calls["stop_at"]:
            raise KeyboardInterrupt
        return real_chunk(*a, **k)

    monkeypatch.setattr(path_module, "_patch_chunk", counted)
    monkeypatch.setattr(path_module, "code_version", lambda: "0.1.0+older-engine")
    assert run_cli(args, capsys)[0] == 130
    assert len(list(out.glob(".partial/*/chunk-*.pt"))) == 1  # one chunk saved by the older engine
    monkeypatch.setattr(path_module, "code_version", lambda: "0.1.0+newer-engine")
    calls.update(n=0, stop_at=-1)
    assert run_cli(args, capsys)[0] == 0
    rerun = calls["n"]
    calls["n"] = 0
    fresh = tmp_path / "fresh"
    assert run_cli([*args[:-5], "--out", str(fresh), "--batch-size", "2", "--quiet"], capsys)[0] == 0
    assert rerun == calls["n"] >= 2  # the rerun computed every chunk, as a fresh run does: the old one was not reused
    assert (out / "effects.csv").read_text() == (fresh / "effects.csv").read_text()


def test_the_code_version_changes_with_the_source(tmp_path: Path, monkeypatch) -> None:
    from arithmech import runs

    first = runs.code_version()
    assert re.fullmatch(r".+\+[0-9a-f]{12}", first) and first == runs.code_version()
    runs.code_version.cache_clear()
    package = tmp_path / "arithmech"
    package.mkdir()
    (package / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(runs, "__file__", str(package / "runs.py"))
    one = runs.code_version()
    runs.code_version.cache_clear()
    (package / "a.py").write_text("x = 2\n")
    assert runs.code_version() != one
    runs.code_version.cache_clear()


def _bad_prompt_files(tmp: Path, llama_dir: Path, queries: list[str]) -> dict[str, tuple[Path, str]]:
    wrong = ["x" if a != "x" else "y" for a in model_answers(llama_dir, queries)]
    return {
        "empty": (write_jsonl(tmp / "empty.jsonl", []), "empty"),
        "not-jsonl": ((tmp / "bad.jsonl"), "not JSON"),
        "missing-field": (
            write_jsonl(tmp / "missing.jsonl", [{"reference": "1 + 1 = ", "answer": "2"}]),
            "counterfactual",
        ),
        "empty-answer": (
            write_jsonl(tmp / "noans.jsonl", [{"reference": "1 + 1 = ", "counterfactual": "1 @ 1 = ", "answer": ""}]),
            "answer",
        ),
        "length-mismatch": (
            write_jsonl(tmp / "len.jsonl", [{"reference": "1 + 1 = ", "counterfactual": "1 plus 1 = ", "answer": "2"}]),
            "token length",
        ),
        "none-correct": (
            write_jsonl(
                tmp / "wrong.jsonl",
                [
                    {"reference": q, "counterfactual": operator_swap(q), "answer": w}
                    for q, w in zip(queries, wrong, strict=True)
                ],
            ),
            "--keep-incorrect",  # not --few-shot, which a prompt file does not use
        ),
    }


@pytest.mark.parametrize(
    "case", ["empty", "not-jsonl", "missing-field", "empty-answer", "length-mismatch", "none-correct"]
)
def test_bad_prompt_files(case: str, llama_dir: Path, queries: list[str], tmp_path: Path, capsys) -> None:
    (tmp_path / "bad.jsonl").write_text('{"reference": "1 + 1 = "\n')
    path, expected = _bad_prompt_files(tmp_path, llama_dir, queries)[case]
    out = tmp_path / "run"
    code, _, stderr = run_cli(
        ["identify", "--model", str(llama_dir), "--prompts", str(path), "--out", str(out)], capsys
    )
    assert code == 2
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and expected in lines[0], stderr
    assert "Traceback" not in stderr
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model", "/no/such/dir/or-model"], "could not find model"),
        (["--model", "/tmp/no-such-file.gguf"], "does not exist"),
        (["--device", "cuda:3"], "not available"),
        (["--device", "tpu"], "not known"),
        (["--dtype", "float8"], "dtype"),
        (["--variant", "sideways"], "variant"),
        (["--operations", "exponentiation"], "operations"),
    ],
)
def test_bad_options(args: list[str], expected: str, tmp_path: Path, capsys, monkeypatch) -> None:
    if "--device" in args and "cuda" in args[1] and torch.cuda.is_available():
        pytest.skip("CUDA is present")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, stderr = run_cli(["identify", *args, "--out", str(tmp_path / "run")], capsys)
    assert code == 2, stderr
    assert expected in stderr and "Traceback" not in stderr
    assert not (tmp_path / "run").exists()


def test_template_without_slots(llama_dir: Path, tmp_path: Path, capsys) -> None:
    bad = [
        {
            "id": "t1",
            "operation": "addition",
            "formation": "equation",
            "text": "{A} + 3 = ",
            "operator": "+",
            "counterfactual_operator": "@",
        }
    ]
    path = tmp_path / "templates.json"
    path.write_text(json.dumps(bad))
    code, _, stderr = run_cli(["identify", "--model", str(llama_dir), "--templates", str(path)], capsys)
    assert code == 2 and "{B}" in stderr


def test_help_explains_every_option(capsys) -> None:
    assert main(["identify", "--help"]) == 0
    text = capsys.readouterr().out
    for option in (
        "--model",
        "--gguf-file",
        "--device",
        "--dtype",
        "--prompts",
        "--variant",
        "--threshold",
        "--fraction-threshold",
        "--top-k",
        "--out",
        "--quiet",
        "--few-shot",
        "--max-prompts",
    ):
        assert option in text


def test_usage_error_is_one_line(capsys) -> None:
    code, _, stderr = run_cli(["identify", "--top-k", "many"], capsys)
    assert code == 2 and "Traceback" not in stderr and "--top-k" in stderr


def test_method_both_writes_attribution_and_agreement(
    llama_dir: Path, good_prompts: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "run"
    args = ["identify", "--model", str(llama_dir), "--prompts", str(good_prompts), "--out", str(out), "--quiet"]
    assert run_cli([*args, "--method", "both"], capsys)[0] == 0
    exact = list(csv.DictReader((out / "effects.csv").open()))
    approx = list(csv.DictReader((out / "attribution_effects.csv").open()))
    assert [r["component"] for r in exact] == [r["component"] for r in approx]
    agreement = json.loads((out / "agreement.json").read_text())
    assert -1.0 <= agreement["spearman_all"] <= 1.0 and "top5_overlap" in agreement
    only = tmp_path / "attr"
    assert (
        run_cli(
            [
                "identify",
                "--model",
                str(llama_dir),
                "--prompts",
                str(good_prompts),
                "--out",
                str(only),
                "--quiet",
                "--method",
                "attribution",
            ],
            capsys,
        )[0]
        == 0
    )
    alone, beside = (list(csv.DictReader((d / f).open())) for d, f in ((only, "effects.csv"),
                                                                         (out, "attribution_effects.csv")))
    assert [r["component"] for r in alone] == [r["component"] for r in beside]  # the same ranking
    for a, b in zip(alone, beside, strict=True):  # equal up to float summation order (other chunk batches)
        assert abs(float(a["effect"]) - float(b["effect"])) <= 1e-5, (a, b)
    assert json.loads((only / "metadata.json").read_text())["method"] == "attribution"
    assert not (only / "agreement.json").exists()
