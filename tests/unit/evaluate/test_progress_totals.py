"""Every scorer of evaluate tells its progress bar the total it counts, so the bar shows "n/N" and an ETA (before
issue #22 the bars showed "svamp: 3row [02:00]")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from arithmech.evaluate.arithmetic import score_answers
from arithmech.evaluate.choice import score_choices
from arithmech.evaluate.general import general_scores
from arithmech.evaluate.general_texts import GeneralText
from arithmech.evaluate.generation import generate_greedy
from arithmech.models.archs import spec_for_model_type
from arithmech.models.view import ModelView

from tiny_models import make_tiny_model, make_tiny_tokenizer


class Bar:
    """A progress bar as tqdm is driven: total set, then updates."""

    def __init__(self) -> None:
        self.total: float | None = None
        self.done = 0

    def update(self, n: float | None = 1) -> bool | None:
        assert self.total is not None, "the bar advanced before it was told its total"
        self.done += int(n or 0)
        return None


def _run(scorer: str, view: ModelView, tok: Any, bar: Bar) -> None:
    runs: dict[str, Callable[[], object]] = {
        "generate": lambda: generate_greedy(view.model, tok, ["1+1=", "22+3=", "7+0="], 3, 2, progress=bar),
        "choice": lambda: score_choices(view, tok, ["Q: 1+1?", "Q: 2+2? A:"], [[" 2", " 3"], [" 4", " five"]], 2,
                                        progress=bar),  # fmt: skip
        "general": lambda: general_scores(view, tok, [GeneralText(str(i), "some text " * (i + 1)) for i in range(3)],
                                          batch_size=2, progress=bar),  # fmt: skip
        "arithmetic": lambda: score_answers(view, tok, ["1+1=", "2+30=", "4+4="], ["2", "32", "8"], 2, progress=bar),
    }
    runs[scorer]()


# choice counts forward rows: each option of several tokens is its own row (2 x 2 here)
@pytest.mark.parametrize(("scorer", "total"), [("generate", 3), ("choice", 4), ("general", 3), ("arithmetic", 3)])
def test_each_scorer_sets_the_total_it_counts(scorer: str, total: int) -> None:
    model = make_tiny_model("llama", seed=0)
    view = ModelView(model, spec_for_model_type("llama"))
    bar = Bar()
    _run(scorer, view, make_tiny_tokenizer(), bar)
    assert bar.total == bar.done == total
