"""Where the benchmark data sets come from: a folder you name, the copy shipped with arithmech, or the hub.

Background
    Transfer's word-problem targets (svamp, gsm8k), every benchmark of evaluate (GSM8K, SVAMP, AddSub,
    SingleEq, the LLM-Adapters math split, MMLU, CommonsenseQA) and finetune's default training data are JSON
    Lines sets named "<set>/<split>", e.g. "svamp/test". All of them ship inside the package as
    `arithmech/data/benchmarks/<set>/<split>.jsonl.gz` (4.5 MB for 17 MB of JSONL), each folder with a
    PROVENANCE.md (source repository and commit, licence, cleaning, caveats), so they work offline and with
    nothing checked out beside the project.

Lookup order (`find_data_file`)
    1. `data_dir` (--data-dir FOLDER),
    2. $ARITHMECH_DATA,
    3. the shipped copy;
    in each root <root>/<set>/<split>.jsonl, then <root>/<set>/<split>.jsonl.gz. A set that none holds is
    looked up on the Hugging Face hub (`hub_rows`), only when the caller knows a hub copy of it and only when
    the optional `datasets` package imports. Otherwise `missing_data` gives the one DataError: the set and
    split, every path looked at, what the hub step did (not installed / not reachable or no such split / no
    known copy) and the fix.

Reading (`read_data_text`, `data_sha256`)
    Wherever a file can be given, .jsonl and .jsonl.gz are both read. The recorded sha256 is that of the
    decompressed JSONL bytes, so a shipped file and its uncompressed original have one checksum: the one in
    PROVENANCE.md.

Usage
    >>> found = find_data_file("svamp/test")
    >>> found.label
    'shipped'
"""

from __future__ import annotations

import gzip
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arithmech.errors import DataError

DATA_ENV = "ARITHMECH_DATA"
SHIPPED_DATA = Path(__file__).resolve().parent / "benchmarks"
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")
SHIPPED = "shipped"


@dataclass(frozen=True)
class DataFile:
    """A data file (or a root folder) and its label: "--data-dir", "$ARITHMECH_DATA" or "shipped"."""

    path: Path
    label: str


def data_roots(data_dir: str | os.PathLike[str] | None = None) -> list[DataFile]:
    """The folders searched for a named set, in order, each with its label."""
    roots = [DataFile(Path(data_dir).expanduser(), "--data-dir")] if data_dir else []
    if os.environ.get(DATA_ENV):
        roots.append(DataFile(Path(os.environ[DATA_ENV]).expanduser(), f"${DATA_ENV}"))
    roots.append(DataFile(SHIPPED_DATA, SHIPPED))
    return roots


def is_jsonl_path(name: str | os.PathLike[str]) -> bool:
    """Whether a name is a file path (.jsonl or .jsonl.gz) rather than a set name."""
    return str(name).endswith(JSONL_SUFFIXES)


def find_data_file(name: str, data_dir: str | os.PathLike[str] | None = None) -> DataFile | None:
    """<root>/<name>.jsonl or .jsonl.gz in the first root that has it (`name` is "<set>/<split>")."""
    for root in data_roots(data_dir):
        for suffix in JSONL_SUFFIXES:
            path = root.path / f"{name}{suffix}"
            if path.is_file():
                return DataFile(path, root.label)
    return None


def read_data_text(path: Path) -> str:
    """The text of a .jsonl file, or of a .jsonl.gz decompressed; a file that cannot be read is a DataError."""
    try:
        return _data_bytes(path).decode("utf-8-sig")  # a byte-order mark is fine
    except UnicodeDecodeError as exc:
        raise DataError(f"could not read {path} as UTF-8 text ({exc}); write JSON Lines in UTF-8") from exc


def _data_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
        return gzip.decompress(raw) if path.name.endswith(".gz") else raw
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise DataError(f"could not read {path} ({exc}); check the path, or that a .gz file is gzip") from exc


def data_sha256(path: Path) -> str:
    """The sha256 of the file's JSONL bytes (decompressed for .jsonl.gz)."""
    return hashlib.sha256(_data_bytes(path)).hexdigest()


def hub_rows(repo: str, config: str | None, split: str) -> tuple[list[dict[str, Any]] | None, str]:
    """(rows in the local schema, "") of a hub data set, or (None, why they could not be had)."""
    try:
        import datasets  # type: ignore[import-not-found]
    except ImportError:
        return None, f"{repo} was not tried: the datasets package is not installed (pip install datasets)"
    try:
        data = datasets.load_dataset(repo, config, split=split)
    except Exception as exc:  # offline, renamed, or no such split: the caller raises one DataError
        detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        return None, (f"{repo} {split} could not be loaded: the hub could not be reached or has no such split "
                      f"({type(exc).__name__}{': ' + detail if detail else ''})")
    return [hub_row(repo, dict(row), i) for i, row in enumerate(data)], ""


def hub_row(repo: str, row: dict[str, Any], index: int) -> dict[str, Any]:
    """One hub row in the local schema (the conversions of each set's PROVENANCE.md)."""
    name = repo.split("/")[-1].lower()
    if repo == "openai/gsm8k":
        return {"id": f"gsm8k-hub-{index:04d}", "question": row["question"],
                "answer": row["answer"].split("####")[-1].replace(",", "").strip()}
    if repo == "ChilleD/SVAMP":
        body = row["Body"].rstrip()
        question = body + ("" if body.endswith((".", "?", "!")) else ".") + " " + row["Question"].strip()
        return {"id": f"svamp-{row.get('ID', index)}", "question": question, "answer": row["Answer"]}
    if repo == "cais/mmlu":
        return {"id": f"mmlu-hub-{row['subject']}-{index:05d}", "subject": row["subject"],
                "question": row["question"], "choices": list(row["choices"]), "answer": int(row["answer"])}
    if repo == "tau/commonsense_qa":
        labels = list(row["choices"]["label"])
        return {"id": row["id"], "question": row["question"], "choices": list(row["choices"]["text"]),
                "answer": labels.index(row["answerKey"])}
    return {"id": f"{name}-{index:05d}", **row}


def missing_data(name: str, data_dir: str | os.PathLike[str] | None, hub: str | None, as_path: str) -> DataError:
    """The error for a set found nowhere: what, where it looked, what the hub step did, and the fix.

    `hub` is the hub step's outcome (None: no hub copy is known); `as_path` says how to give a file instead,
    e.g. "give a .jsonl path to --data".
    """
    set_name, _, split = name.partition("/")
    looked = ", ".join(
        f"{root.path / name}.jsonl(.gz) ({root.label}{'' if root.path.is_dir() else ', no such folder'})"
        for root in data_roots(data_dir)
    )
    hub_step = f"the hub copy {hub}" if hub else "no hub copy of it is known"
    return DataError(
        f"could not find the {set_name} {split or 'data'} set: looked for {looked}; {hub_step}; pass --data-dir "
        f"FOLDER holding {name}.jsonl, set ${DATA_ENV}=FOLDER, or {as_path}"
    )
