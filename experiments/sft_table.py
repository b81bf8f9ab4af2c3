"""The paper's Table 1 at laptop scale: base vs precise SFT (several k) vs full SFT vs LoRA on the default model.

Every method trains on the same rows of the LLM-Adapters math train split with the same schedule and
hyperparameters, then every model is scored on the leakage-free LLM-Adapters test rows of GSM8K, SVAMP,
AddSub and SingleEq (8-shot chain of thought) and on MMLU, CommonsenseQA and general-text perplexity / KL to
the base model. Writes <out>/table.md and <out>/table.csv; each training and evaluation lands in its own
subfolder, so a rerun skips what is finished (the stages resume).

The samples/s column is each training's own measurement (the finetune stage's metadata.json). All trainings run
one after another before any evaluation, so their rates are measured back to back under the same load;
--train-only stops there: into a fresh --out it remeasures the column alone (about 7 minutes on 2 idle CPU
cores for the table in docs/results.md).

    python experiments/sft_table.py --from runs/demo --out runs/sft-table            # about an hour on 2 CPU cores
    python experiments/sft_table.py --from runs/demo --out runs/sft-speed --train-only
    python experiments/sft_table.py --from runs/demo --train-samples 1024 --eval-limit 50 --device cuda
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

MATH = ("adapters-gsm8k", "adapters-svamp", "adapters-addsub", "adapters-singleeq")
GENERAL = ("mmlu", "csqa", "general")


def _run(args: list[str]) -> None:
    print("+ arithmech " + " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "arithmech.cli", *args, "--quiet"], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="from_run", default="runs/demo", help="identify run folder (key heads)")
    parser.add_argument("--out", default="runs/sft-table")
    parser.add_argument("--ks", default="4,16,32", help="precise SFT with the top-k heads, for each k")
    parser.add_argument("--train-samples", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--eval-limit", type=int, default=10, help="rows per math benchmark")
    parser.add_argument("--general-limit", type=int, default=40, help="rows of MMLU and CommonsenseQA")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--n-shot", type=int, default=8, help="chain-of-thought exemplars before each math question")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--data", default="llm_adapters_math_v1", help="training rows (finetune's --data)")
    parser.add_argument("--max-length", type=int, default=None, help="longest training row in tokens (finetune's)")
    parser.add_argument("--model", default=None, help="default: the built-in SmolLM2-135M-Instruct")
    parser.add_argument("--train-only", action="store_true", help="train (samples/s column) but evaluate nothing")
    args = parser.parse_args()
    out = Path(args.out)
    model = ["--model", args.model] if args.model else []
    data = ["--data", args.data, *(["--target", "rationale"] if args.data == "llm_adapters_math_v1" else [])]
    train = [*data, "--max-samples", str(args.train_samples),
             "--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--micro-batch-size",
             str(args.micro_batch_size), "--lr", str(args.lr), "--device", args.device, *model,
             *(["--max-length", str(args.max_length)] if args.max_length else [])]  # fmt: skip
    methods: dict[str, list[str]] = {"base": []}
    for k in args.ks.split(","):
        methods[f"precise-top{k}"] = ["--method", "precise", "--from", args.from_run, "--top-k", k]
    methods["full"] = ["--method", "full"]
    methods["lora"] = ["--method", "lora"]
    for name, how in methods.items():  # every training before any evaluation: their samples/s are comparable
        if how and not (out / name / "metadata.json").is_file():
            _run(["finetune", *how, *train, "--out", str(out / name)])
    groups = () if args.train_only else ("math", "general")
    evaluations = {"math": (MATH, args.eval_limit), "general": (GENERAL, args.general_limit)}
    rows = []
    for name, how in methods.items():
        folder = out / name
        for group in groups:
            benches, limit = evaluations[group]
            target = folder / f"eval-{group}"
            if not (target / "metadata.json").is_file():
                delta = ["--delta", str(folder)] if how else []
                shots = ["--n-shot", str(args.n_shot)] if group == "math" else []
                _run(["evaluate", *delta, *shots, "--benchmarks", ",".join(benches), "--limit", str(limit),
                      "--max-new-tokens", str(args.max_new_tokens), "--base-model", args.model or "default",
                      "--device", args.device, *model, "--out", str(target)])  # fmt: skip
        rows.append(_row(name, folder, groups))
    _write(out, rows, evaluated=bool(groups))


def _row(name: str, folder: Path, groups: tuple[str, ...]) -> dict[str, object]:
    row: dict[str, object] = {"method": name}
    meta_path = folder / "metadata.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        row["trainable_parameters"] = meta["trainable_parameters"]
        row["samples_per_second"] = round(meta["samples_per_second"], 3)
        row["final_loss"] = meta["final_loss"]
    for group in groups:
        for result in csv.DictReader((folder / f"eval-{group}" / "results.csv").open()):
            for key, value in result.items():
                if key not in ("benchmark",) and value not in ("", None):
                    row[f"{result['benchmark']}:{key}"] = value
    return row


def _write(out: Path, rows: list[dict[str, object]], evaluated: bool) -> None:
    keys = list(dict.fromkeys(k for row in rows for k in row))
    with (out / "table.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    scores = [*[f"{b}:accuracy" for b in (*MATH, "mmlu", "csqa")], "general:perplexity", "general:kl"]
    cols = ["method", "trainable_parameters", "samples_per_second", *(scores if evaluated else ["final_loss"])]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in cols) + " |" for row in rows]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
