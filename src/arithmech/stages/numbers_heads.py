"""The numbers stage's Clock heads: identify's key heads named a,b, a+b, mixed or unexplained by the share of each
head's effect that helix(a, b) and helix(a+b) explain (Kantamneni & Tegmark's c_{a,b} and c_{a+b}; rule and
definitions in `analysis/clock_fits.py`).

Per head (l, h), over the Clock's rows (the correct prompts, `numbers_clock.ClockRows`)
1. o(a, b) [row, d_model]: the head's output at the last token (its o_proj input slice times its W_O block), one
   forward pass of the rows' prompts (`patching/states.collect_end_states`) for every head at once;
2. fits of o: helix(a, b), helix(a+b), helix(a, b, a+b) (`number_fits.fit_basis`: PCA to d_head dimensions at
   most, least squares, leave-one-out prediction of train rows; no shuffled control, the chance level is each
   fit's patch of another prompt);
3. patching, on the Clock's pairs: the corrupted run's head output o_x at the last token replaced by the clean
   one (the head's whole effect) or by o_x + Q Q^T (f(.) - o_x) for the clean prompt and for another prompt,
   pushed through the rest of layer l (`patching/subspace.after_head`) and joined at layer l + 1
   (`patch_rows`, from the corrupted run's own keys and values);
4. c_ab, c_sum, c_joint: the restored shares of the head's whole effect on the train and on the held-out
   pairs; the class from the held-out shares where they exist (as the verdict ranks readings), else the train
   ones; beside them the head's own effect as a share of clean - corrupted.
Against K&T: a,b heads should sit in earlier layers than a+b heads (`order_sentence`).
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

from arithmech.analysis.clock_fits import clock_families, head_class
from arithmech.analysis.number_fits import Fit, fit_basis
from arithmech.analysis.restored_share import not_estimable, restored_share, share
from arithmech.data.number_grid import NumberGrid, Partner
from arithmech.models.sites import Component
from arithmech.models.view import ModelView
from arithmech.patching.states import collect_end_states
from arithmech.patching.subspace import after_head, patch_rows, row_cost
from arithmech.stages.numbers_clock import ClockRows
from arithmech.stages.numbers_config import NumbersConfig
from arithmech.stages.numbers_grid import TokenLayers, pad_ids
from arithmech.stages.numbers_patching import Indices, pair_chunks, query_end

HEAD_COLUMNS = (
    "head",
    "layer",
    "identify_effect",
    "class",
    "c_ab",
    "c_sum",
    "c_joint",
    "c_ab_heldout",
    "c_sum_heldout",
    "c_joint_heldout",
    "head_share",
    "ld_head",
    "ld_clean",
    "ld_corrupted",
    "r2_ab",
    "r2_sum",
    "r2_joint",
    "pairs",
    "heldout_pairs",
    "classified_on",
    "reason",
)
"""The columns of numbers_clock_heads.csv, in order."""
_SHORT = {"a,b": "ab", "a+b": "sum", "a,b,a+b": "joint"}
"""Column suffix of each helix's operand set."""


@torch.no_grad()
def head_outputs(view: ModelView, grid: NumberGrid, rows: ClockRows, heads: list[Component], pad: int,
                 batch_size: int, cost: TokenLayers) -> dict[Component, torch.Tensor]:  # fmt: skip
    """head -> o [row, d_model] float64: its output at each row's last token."""
    parts: dict[Component, list[torch.Tensor]] = {h: [] for h in heads}
    for start in range(0, len(rows.prompts), batch_size):
        chunk = [grid.prompts[i] for i in rows.prompts[start : start + batch_size]]
        ids, mask = pad_ids([p.ids for p in chunk], pad)
        cost.forward("heads_grid", mask)
        states = collect_end_states(view, ids, mask, torch.tensor([p.positions["last"] for p in chunk]))
        for h in heads:
            parts[h].append(view.head_outputs(h.layer, states.z[h.layer])[:, h.head].double().cpu())  # [batch, d]
    return {h: torch.cat(parts[h]) for h in heads}


def head_fits(outputs: torch.Tensor, rows: ClockRows, periods: tuple[int, ...], d_head: int) -> dict[str, Fit]:
    """operand set ("a,b", "a+b", "a,b,a+b") -> the fit of the head's outputs [row, d_model]."""
    train = ~rows.held
    dim = min(d_head, int(train.sum()) - 1)
    return {",".join(f.operands): fit_basis(outputs, rows.basis(f), train, f, dim)
            for f in clock_families(periods) if f.kind == "helix"}  # fmt: skip


@torch.no_grad()
def classify_heads(view: ModelView, grid: NumberGrid, cfg: NumbersConfig, rows: ClockRows,
                   pairs: list[tuple[int, Partner]], heads: list[Component], effects: dict[Component, float],
                   periods: tuple[int, ...], pad: int, indices: Indices, cost: TokenLayers, quiet: bool,
                   tqdm: Any) -> list[dict[str, Any]]:  # fmt: skip
    """numbers_clock_heads.csv's rows (steps 1-4 of the module docstring), heads in layer order."""
    outputs = head_outputs(view, grid, rows, heads, pad, cfg.batch_size, cost)
    fits = {h: head_fits(outputs[h], rows, periods, view.dims.d_head) for h in heads}
    n = len(pairs)
    ld = {"clean": torch.empty(n), "corrupted": torch.empty(n)}
    for h in heads:
        for key in ("whole", *(f"{tag}:{ops}" for ops in _SHORT for tag in ("fit", "other"))):
            ld[f"{h.name}|{key}"] = torch.empty(n)
    n_layers = view.dims.n_layers
    clean_rows, other_rows = indices(pairs)  # drawn before the passes: the same in any batching
    with tqdm(total=n, desc="patch heads", unit="prompt", disable=quiet) as bar:
        for part in pair_chunks(view, pairs, cfg.batch_size, pad, cost, "heads_bases"):
            chunk, idx, mask, corr = part.pairs, part.idx, part.mask, part.corr
            at = query_end(grid, [i for i, _ in chunk])
            states = collect_end_states(view, corr.ids, mask, torch.full((len(chunk),), at))  # z, attn_out at `at`
            cost.forward("heads_bases", mask)
            ld["clean"][idx], ld["corrupted"][idx] = part.ld_clean, part.ld_corr
            clean_row, other_row = clean_rows[idx], other_rows[idx]
            keys, layer_of, vectors = [], [], []
            for h in heads:
                o_x = view.head_outputs(h.layer, states.z[h.layer])[:, h.head].double().cpu()  # [prompt, d_model]
                new = {"whole": outputs[h][clean_row]}
                for ops, fit in fits[h].items():
                    for tag, r in (("fit", clean_row), ("other", other_row)):
                        new[f"{tag}:{ops}"] = o_x + ((fit.pred[r] - o_x) @ fit.q) @ fit.q.T
                for key, o in new.items():
                    x = after_head(view, h.layer, states.resid_pre[h.layer], states.attn_out[h.layer],
                                   (o - o_x).to(states.attn_out.device))  # [prompt, d_model]
                    keys.append(f"{h.name}|{key}")
                    layer_of.append(h.layer + 1)
                    vectors.append(x)
            k = len(chunk)
            prompt = torch.arange(k).repeat(len(keys))
            layer_t = torch.tensor(layer_of).repeat_interleave(k)
            out = patch_rows(view, corr, at, prompt, layer_t, torch.cat(vectors), part.read, part.good, part.bad,
                             cfg.max_rows)
            cost.add("heads_rows", row_cost(n_layers, layer_t, int(mask.shape[1]) - at))
            for v, key in enumerate(keys):
                ld[key][idx] = out[v * k : (v + 1) * k]
            bar.update(len(chunk))
            del part, corr, states, vectors  # this chunk's runs go before the next chunk's are made
    held_values = set(rows.a[rows.held].tolist())
    held = torch.tensor([grid.prompts[i].a in held_values for i, _ in pairs], dtype=torch.bool)
    return [_head_row(h, effects.get(h), fits[h], ld, held, cfg.min_effect) for h in heads]


def _head_row(h: Component, effect: float | None, fits: dict[str, Fit], ld: dict[str, torch.Tensor],
              held: torch.Tensor, min_effect: float) -> dict[str, Any]:  # fmt: skip
    """One head's row of numbers_clock_heads.csv."""
    train = ~held
    clean, corr, whole = ld["clean"], ld["corrupted"], ld[f"{h.name}|whole"]
    why = not_estimable(clean, corr, whole, corr, train, min_effect, "head")
    def mean(x: torch.Tensor) -> float | None:
        return float(x[train].mean()) if bool(train.any()) else None

    row: dict[str, Any] = {**dict.fromkeys(HEAD_COLUMNS), "head": h.name, "layer": h.layer,
                           "identify_effect": effect, "ld_head": mean(whole), "ld_clean": mean(clean),
                           "ld_corrupted": mean(corr), "head_share": share(whole, corr, clean, train),
                           "pairs": int(train.sum()), "heldout_pairs": int(held.sum()), "reason": why}  # fmt: skip
    for ops, short in _SHORT.items():
        value, other = ld[f"{h.name}|fit:{ops}"], ld[f"{h.name}|other:{ops}"]
        row[f"c_{short}"] = restored_share(value, other, whole, train, clean, corr, min_effect)
        row[f"c_{short}_heldout"] = restored_share(value, other, whole, held, clean, corr, min_effect)
        row[f"r2_{short}"] = fits[ops].r2
    on_held = any(row[f"c_{s}_heldout"] is not None for s in _SHORT.values())
    suffix = "_heldout" if on_held else ""
    row["classified_on"] = "heldout" if on_held else "train"
    row["class"] = head_class(row[f"c_ab{suffix}"], row[f"c_sum{suffix}"], row[f"c_joint{suffix}"])
    return row


def order_sentence(rows: list[dict[str, Any]]) -> str:
    """The classified heads against Kantamneni & Tegmark's finding that a,b heads sit before a+b heads."""
    by_class = {c: [int(r["layer"]) for r in rows if r["class"] == c] for c in ("a,b", "a+b", "mixed", "unexplained")}
    counts = ", ".join(f"{len(v)} {c}" for c, v in by_class.items())
    ab, total = by_class["a,b"], by_class["a+b"]
    head = (f"Of {len(rows)} heads classified by the share of their effect the helices explain: {counts}. "
            "Kantamneni & Tegmark find that heads of earlier layers move a and b to the last token and heads of "
            "later layers write a + b")  # fmt: skip
    if not ab or not total:
        missing = "neither kind" if not ab and not total else "no a,b head" if not ab else "no a+b head"
        return f"{head}; here {missing} is found, so the order cannot be compared."
    ab_mid, total_mid = statistics.median(ab), statistics.median(total)
    verdict = ("the same order" if ab_mid < total_mid else "the opposite order" if ab_mid > total_mid else
               "no order (the same median layer)")  # fmt: skip
    return (f"{head}; here the a,b heads sit at layer {ab_mid:g} (median) and the a+b heads at {total_mid:g}: "
            f"{verdict}.")
