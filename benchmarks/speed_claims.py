"""What the docs and the README say against TransformerLens and nnsight, and the README's speed paragraph, rendered
from benchmarks/results.json (`readme_tables.py` writes them into their pages).

- `peers_table`: benchmarks/peers.py's entry of one size as a table, one column per prompt set
  (`suite.PEER_PROMPT_SETS`): each side's time as the median of the interleaved repetitions with their min and
  max, the ratios likewise, and the counts. An entry recorded before the repetitions (single timings, whose order
  between the peers flipped from one size to the other) is left out, and the table says so.
- `speed_paragraph`: the README's paragraph, from the full-size entries of path_patching.py and peers.py.

Every count is in forward passes of the prompts (each prompt at its own length, the logits of its last token:
tests/forward_cost.py `prompt_forward_macs`), the unit in which one forward pass per component costs one per
component; the padded unit (the right-padded batch, logits at every position) is labelled wherever it appears. A
number that results.json lacks is rendered as "not measured yet".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from suite import PEER_PROMPT_SETS

Metrics = Mapping[str, Any]
NOT_MEASURED = "not measured yet"
PEERS = "peers"
PEERS_HOW = '`pip install "arithmech[peers]"`, then `python benchmarks/compare.py --only peers --update`, `--full` too'

PEER_ROWS = (
    ("tl", "TransformerLens", "TransformerLens (TransformerBridge, `get_act_patch_attn_head_out_by_pos`)"),
    ("nnsight", "nnsight", "nnsight (one trace per head)"),
)
SETS = (("short", "short prompts"), ("default", "the default prompts"))
"""How the pages name the prompt sets."""


def _seconds(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:#.3g}"


def _times(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def _spread(m: Metrics, key: str, show: Any, unit: str) -> str:
    """`median unit (min-max)` of a metric peers.py records with its spread; the value alone where it has none."""
    if f"{key}_min" not in m:
        return f"{show(m[key])}{unit}"
    return f"{show(m[key])}{unit} ({show(m[f'{key}_min'])}-{show(m[f'{key}_max'])})"


def _legacy(entry: Mapping[str, Any]) -> bool:
    """An entry of peers.py from before the repetitions: one timing per side, one prompt set, no `repeats`."""
    return "repeats" not in entry["metrics"]


def _column(m: Metrics, name: str, label: str) -> str:
    if f"{name}_tokens" not in m:
        return f"{label}: {NOT_MEASURED}"
    return (f"{label} ({PEER_PROMPT_SETS[name]} solved examples): {m[f'{name}_tokens']:.1f} tokens a prompt on "
            f"average, {m[f'{name}_prompts']:.0f} pairs ({m[f'{name}_padded_width']:.0f} padded)")  # fmt: skip


def _cells(m: Metrics, row: Any) -> list[str]:
    """One cell per prompt set: `row(metrics, set name)`, or "not measured yet" where the set lacks its metrics."""
    cells = []
    for name, _ in SETS:
        try:
            cells.append(row(m, name))
        except KeyError:
            cells.append(NOT_MEASURED)
    return cells


def _peer_time(key: str) -> Any:
    def row(m: Metrics, s: str) -> str:
        per_head = m[f"{s}_{key}_s_per_head"]
        counted = m.get(f"{s}_{key}_prompt_passes_per_head")
        return (f"{_spread(m, f'{s}_{key}_s_per_head', _seconds, ' s')} per head: "
                f"{per_head / m[f'{s}_prompt_forward_s']:.2f} forward passes by time"
                + ("" if counted is None else f", {counted:.2f} counted")
                + f"; max \\|difference\\| to arithmech {m[f'{s}_{key}_max_abs_diff']:.1e}")  # fmt: skip

    return row


def _scan(variant: str) -> Any:
    def row(m: Metrics, s: str) -> str:
        counts = f"{m[f'{s}_{variant}_prompt_passes']:.2f} forward passes of the prompts"
        return f"{_spread(m, f'{s}_{variant}_s', _seconds, ' s')}; {counts}, {m[f'{s}_{variant}_passes']:.2f} padded"

    return row


def _versus(key: str) -> Any:
    def row(m: Metrics, s: str) -> str:
        return f"**{_spread(m, f'{s}_total_vs_{key}', _times, 'x')}**"

    return row


def peers_table(size: str, entry: Mapping[str, Any] | None, provenance: str = "") -> str:
    """The side-by-side table of one size (`provenance`: when, where and at which commit it was measured)."""
    caption = f"Side by side with TransformerLens and nnsight, {size} size"
    if entry is None:
        return f"{caption}: nothing recorded yet ({PEERS_HOW})."
    if _legacy(entry):
        return (f"{caption}: {NOT_MEASURED} in repeated timings. The stored entry ({entry['date']}, git "
                f"{entry['git_sha'][:7]}, `{entry['command']}`) timed each side once on one prompt set, and single "
                f"timings reorder the peers from run to run, so it is left out ({PEERS_HOW}).")  # fmt: skip
    m = entry["metrics"]
    n = m["components"]
    lines = [f"{caption} (`{entry['command']}`); {provenance}. Each time is the median of {m['repeats']} interleaved "
             "repetitions (arithmech, then each peer, their order rotating), min-max in brackets; each ratio is "
             "the median of the repetitions' ratios (a peer's time per head times the components over arithmech's "
             "time in the same repetition). Counts are in forward passes of the prompts (each at its own length, "
             "logits of its last token), a peer's on its warm-up head; padded: the same work in forward passes of "
             "the right-padded batch with logits at every position:", "",
             "| | " + " | ".join(_column(m, name, label) for name, label in SETS) + " |",
             "|---|" + "---|" * len(SETS)]  # fmt: skip

    def add(what: str, row: Any) -> None:
        lines.append(f"| {what} | " + " | ".join(_cells(m, row)) + " |")

    peers = [(key, short, what) for key, short, what in PEER_ROWS if any(f"{s}_{key}_s_per_head" in m for s, _ in SETS)]
    for key, _, what in peers:
        add(what, _peer_time(key))
    add("one forward pass of the prompts (each at its own length, logits of its last token)",
        lambda m, s: f"{_seconds(m[f'{s}_prompt_forward_s'])} s")  # fmt: skip
    add(f"arithmech `--variant total`, all {n} components", _scan("total"))
    add(f"arithmech `--variant path`, all {n} components (timed once)", _scan("path"))
    for key, short, _ in peers:
        add(f"arithmech `--variant total` against {short}: time ratio on all {n} components", _versus(key))
    return "\n".join(lines)


def torch_threads(machine: Mapping[str, Any]) -> str:
    """`1 torch thread` from a machine fingerprint; empty for an entry recorded before the count was."""
    n = machine.get("torch_threads")
    return f"{n} torch thread{'s' if n != 1 else ''}" if n else ""


def speed_paragraph(full: Mapping[str, Mapping[str, Any]]) -> str:
    """The README's speed paragraph from the full-size entries (benchmark name -> entry), unwrapped."""
    patching = full.get("path_patching", {}).get("metrics", {})
    peers_entry = full.get(PEERS)
    peers = {} if peers_entry is None or _legacy(peers_entry) else peers_entry["metrics"]
    n = patching.get("components") or (peers_entry or {}).get("metrics", {}).get("components")  # a count, any entry
    every = f"all {n} heads and MLPs" if n else "every head and MLP"
    if "path_prompt_passes" in patching and "total_prompt_passes" in patching:
        cost = (f"{every} cost {patching['path_prompt_passes']:.1f} ({patching['total_prompt_passes']:.1f} for "
                "activation patching)")  # fmt: skip
    else:
        cost = f"what {every} cost is {NOT_MEASURED}"
    if "loop_prompt_passes" in patching:  # the loop ran the engine's length chunks
        low, high = sorted([patching["speedup"], patching["total_speedup"]])
        machine = full["path_patching"]["machine"]
        threads = f" ({torch_threads(machine)} on both sides)" if torch_threads(machine) else ""
        loop = f"they take {_times(low)}-{_times(high)}x less time on a {machine['logical_cores']}-core CPU{threads}"
    else:
        loop = f"their time ratio is {NOT_MEASURED}"
    repeats = f"the median of {peers['repeats']} interleaved repetitions" if peers else "the median of repetitions"
    versus = "; ".join(_versus_clause(peers, name, label) for name, label in reversed(SETS))
    return (
        "Path patching is exact and fast. Counted in forward passes of the prompts (each prompt at its own length, "
        f"the logits of its last token only), in which the usual loop costs one per component, {cost}; against "
        f"that loop run on the same chunks of prompts of about one length {loop}. Against TransformerLens and "
        f"nnsight, which run one forward pass per component, activation patching of every component takes, as "
        f"{repeats}: {versus}. The comparison is algorithmic: cached last-token recomputation against one full "
        "pass per component (`make bench-full-update`; [performance](docs/performance.md))."
    )


def _versus_clause(m: Metrics, name: str, label: str) -> str:
    """`80x (TransformerLens) and 95x (nnsight) less time on the default prompts (45 tokens a prompt)`, or
    `not measured yet on the default prompts`."""
    found = [(short, m[f"{name}_total_vs_{key}"]) for key, short, _ in PEER_ROWS if f"{name}_total_vs_{key}" in m]
    if not found:
        return f"{NOT_MEASURED} on {label} ({PEER_PROMPT_SETS[name]} solved examples)"
    times = " and ".join(f"{_times(value)}x ({short})" for short, value in found)
    return f"{times} less time on {label} ({m[f'{name}_tokens']:.0f} tokens a prompt)"


def wrap(text: str, width: int = 120) -> str:
    """`text` broken into lines of at most `width` characters (the README's line length)."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines)
