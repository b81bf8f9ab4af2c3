"""Regenerate the benchmark data shipped inside the package from a folder of JSONL sets (a dev tool).

Every `<set>/<split>.jsonl` under FOLDER becomes `src/arithmech/data/benchmarks/<set>/<split>.jsonl.gz`: the
same bytes, gzip-compressed with mtime 0 and no file name in the header, so running this twice on the same
data gives byte-identical files (and a clean `git status`). The sha256 of each file's decompressed bytes is
printed; it is the sha256 that `arithmech evaluate` records and that the PROVENANCE.md files list. Write or
update `<set>/PROVENANCE.md` by hand: source, licence, cleaning and caveats.

Usage
    python scripts/ship_benchmark_data.py /path/to/data          # e.g. the tests' reference copy
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import sys
from pathlib import Path

SHIPPED = Path(__file__).resolve().parents[1] / "src" / "arithmech" / "data" / "benchmarks"


def ship(folder: Path, dest: Path = SHIPPED) -> list[tuple[str, int, str]]:
    """Compress every <set>/<split>.jsonl of `folder` into `dest`; (relative name, rows, sha256) of each."""
    sources = sorted(folder.glob("*/*.jsonl"))
    if not sources:
        raise SystemExit(f"no <set>/<split>.jsonl files under {folder}; give the data folder")
    shipped = []
    for source in sources:
        raw = source.read_bytes()
        target = dest / source.parent.name / (source.name + ".gz")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        with partial.open("wb") as out, gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0,
                                                      compresslevel=9) as packed:
            packed.write(raw)
        partial.replace(target)
        rows = sum(1 for line in raw.decode("utf-8").split("\n") if line.strip())
        shipped.append((f"{source.parent.name}/{source.name}", rows, hashlib.sha256(raw).hexdigest()))
    return shipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="folder holding <set>/<split>.jsonl files")
    args = parser.parse_args(argv)
    for name, rows, sha in ship(args.folder):
        print(f"| `{name}.gz` | {rows:,} | `{sha}` |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
