"""The attention-roles stage end to end: identify run folder -> attention_roles.csv, figures, metadata;
and the inputs it must refuse in one sentence."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from arithmech.analysis.attention import ROLES
from arithmech.analysis.head_labels import LABELS
from arithmech.cli import main
from arithmech.errors import ConfigError, DataError
from arithmech.models.hooks import count_hooks
from arithmech.models.load import ModelConfig, ModelHandle, load_model
from arithmech.stages.analyze_attention import analyze_attention
from arithmech.stages.analyze_attention_config import AttentionConfig
from arithmech.stages.identify import identify
from arithmech.stages.identify_config import IdentifyConfig

FILES = ["attention_roles.csv", "attention_roles.png", "attention_examples.png", "attention_examples.json"]


@pytest.fixture(scope="module")
def handle(tiny_model_dir) -> ModelHandle:
    """The tiny GQA llama, loaded with SDPA: the stage must switch to eager itself and switch back."""
    return load_model(ModelConfig(model=str(tiny_model_dir("llama")), attn_implementation="sdpa"))


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An identify run on generated (template) prompts, which carry the spans token roles come from."""
    out = tmp_path_factory.mktemp("identify") / "run"
    code = main([
        "identify", "--model", str(tiny_model_dir("llama")), "--keep-incorrect", "--formations", "equation",
        "--n-per-template", "2", "--out", str(out), "--quiet",
    ])  # fmt: skip
    assert code == 0
    return out


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def edited_run(run_dir: Path, tmp_path: Path, edit: str) -> Path:
    """A copy of the run folder with the prompts' spans removed ("spans") or no key heads ("no_key_heads")."""
    copy = tmp_path / f"run-{edit}"
    shutil.copytree(run_dir, copy)
    if edit == "spans":
        rows = [json.loads(line) for line in (copy / "prompts.jsonl").read_text().splitlines()]
        lines = [json.dumps({k: v for k, v in row.items() if k != "spans"}) for row in rows]
        (copy / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    else:
        key = json.loads((copy / "key_components.json").read_text())
        key["key_heads"] = []
        (copy / "key_components.json").write_text(json.dumps(key))
    return copy


def test_stage_writes_roles_figures_and_metadata(handle: ModelHandle, run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "attention"
    result = analyze_attention(handle, AttentionConfig(n_examples=2), run_dir, out, quiet=True)
    key_heads = json.loads((run_dir / "key_components.json").read_text())["key_heads"]
    assert result.heads_source == "key_heads" and [h.name for h in result.heads] == key_heads
    assert count_hooks(handle.model) == 0 and handle.model.config._attn_implementation == "sdpa"

    for name in [*FILES, "metadata.json"]:
        assert (out / name).stat().st_size > 0, name
    assert all((out / "metadata.json").stat().st_mtime_ns >= (out / f).stat().st_mtime_ns for f in FILES)
    rows = read_csv(out / "attention_roles.csv")
    assert [r["head"] for r in rows] == key_heads
    for row, head, label in zip(rows, result.heads, result.labels, strict=True):
        assert (int(row["layer"]), int(row["head_index"])) == (head.layer, head.head)
        assert sum(float(row[r]) for r in ROLES) == pytest.approx(1.0, abs=1e-4)
        assert float(row["operand"]) == pytest.approx(float(row["A"]) + float(row["B"]), abs=2e-6)
        assert row["label"] == label and label in LABELS

    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["stage"] == "analyze_attention" and metadata["heads"] == key_heads
    assert metadata["counts"]["prompts"] == result.n_prompts > 0
    assert metadata["model"] == handle.source and "operand if A+B >= 0.3" in metadata["label_rule"]
    examples: list[dict[str, Any]] = json.loads((out / "attention_examples.json").read_text())
    assert len(examples) == 2
    first = examples[0]
    assert "".join(first["tokens"]).replace("␣", " ").replace("\\n", "\n") == first["prompt"]
    assert {"A", "B", "operator"} <= set(first["roles"])
    assert len(first["weights"]) == len(key_heads) and len(first["weights"][0]) == len(first["tokens"])


def test_listed_heads_and_top_k_fallback(handle: ModelHandle, run_dir: Path, tmp_path: Path) -> None:
    listed = analyze_attention(
        handle, AttentionConfig(heads="2.3, 0.1", max_prompts=3, n_examples=0), run_dir, tmp_path / "a", True
    )
    assert [h.name for h in listed.heads] == ["2.3", "0.1"] and listed.heads_source == "config"
    assert listed.n_prompts == 3 and not (tmp_path / "a" / "attention_examples.png").exists()

    fallback = analyze_attention(
        handle, AttentionConfig(top_k=4, max_prompts=2), edited_run(run_dir, tmp_path, "no_key_heads"),
        tmp_path / "b", True,
    )  # fmt: skip
    assert fallback.heads_source == "top_k" and len(fallback.heads) == 4


def test_refusals_are_one_sentence(handle: ModelHandle, run_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'7\.1' does not exist: the model has layers 0\.\.2"):
        analyze_attention(handle, AttentionConfig(heads=("7.1",)), run_dir, tmp_path / "x", True)
    with pytest.raises(DataError, match="no character spans"):
        no_spans = edited_run(run_dir, tmp_path, "spans")
        analyze_attention(handle, AttentionConfig(), no_spans, tmp_path / "y", True)

    class SlowTokenizer:
        """The tiny tokenizer seen as a slow one (no offset mapping)."""

        is_fast = False

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return self.inner(*args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    slow = ModelHandle(handle.model, SlowTokenizer(handle.tokenizer), handle.view, handle.source)
    with pytest.raises(DataError, match="slow tokenizer"):
        analyze_attention(slow, AttentionConfig(), run_dir, tmp_path / "z", True)
    assert not any((tmp_path / d / "metadata.json").exists() for d in "xyz")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"heads": "mlp.2"}, "not an attention head"),
        ({"heads": " , "}, "heads is empty"),
        ({"tau": 0.0}, r"tau must be in \(0, 1\]"),
        ({"tau": 1.5}, r"tau must be in \(0, 1\]"),
        ({"top_k": 0}, "top_k must be at least 1"),
        ({"max_prompts": 0}, "max_prompts must be at least 1"),
        ({"n_examples": -1}, "n_examples must be 0 or more"),
    ],
)
def test_config_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AttentionConfig(**kwargs)


def test_config_normalises_heads() -> None:
    assert AttentionConfig(heads="14.2, 18.5").heads == ("14.2", "18.5")
    assert AttentionConfig(heads=["13.6"]).heads == ("13.6",)  # type: ignore[arg-type]


README_ROLES = {  # README "Attention roles of the key heads": (share of END attention per role, label)
    "20.8": ({"A": 0.65, "B": 0.09, "operator": 0.00, "prefix": 0.21, "other": 0.04}, "operand"),
    "14.2": ({"A": 0.03, "B": 0.74, "operator": 0.02, "prefix": 0.10, "other": 0.10}, "operand"),
    "18.5": ({"A": 0.01, "B": 0.04, "operator": 0.02, "prefix": 0.10, "other": 0.83}, "neither"),
}


@pytest.mark.default_model
def test_default_model_heads_play_the_readme_roles(tmp_path: Path) -> None:
    """SmolLM2-135M on the reference set the README table came from: the demo's identify settings
    (configs/default-model.yaml: addition, 3-shot, 64 prompts, seed 0; attribution patching only, which leaves
    the set as it is), analysed whole. Each head's share of END attention per role is within 0.1 of the table,
    and its label is the table's: 20.8 an operand head (A), 14.2 an operand head (B), 18.5 neither."""
    pytest.importorskip("gguf")
    handle = load_model()
    run = tmp_path / "run"  # the identify stage called directly, so the model is loaded once
    reference = identify(handle, IdentifyConfig(max_prompts=64, method="attribution"), run, quiet=True)
    cfg = AttentionConfig(heads=tuple(README_ROLES), max_prompts=len(reference.pairs), n_examples=0)
    result = analyze_attention(handle, cfg, run, tmp_path / "attention", quiet=True)
    assert result.n_prompts == len(reference.pairs) == 64
    for name, measured in result.as_dict().items():
        shares, label = README_ROLES[name]
        assert measured["label"] == label, name
        for role, share in shares.items():
            assert measured[role] == pytest.approx(share, abs=0.1), (name, role)
    assert count_hooks(handle.model) == 0
    assert (tmp_path / "attention" / "metadata.json").is_file()
