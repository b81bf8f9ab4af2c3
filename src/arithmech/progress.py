"""How long-running loops report progress: a bar told its total once known, then advanced (tqdm's interface).

A scorer knows how many units (prompts, rows, texts) it will run only after it has built them, and the stage
that shows the bar does not; so the scorer sets `total` and the bar can show a count of a total and an ETA.
A `tqdm` bar is a `Progress`; tests can pass any object with the two members. `progress_bar` makes the bar a
stage shows (imported when it is made, so importing this module stays light).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Progress(Protocol):
    """A progress bar: `total` is set once the number of units is known, `update(n)` after n more are done."""

    total: float | None

    def update(self, n: float | None = 1) -> bool | None: ...


@contextmanager
def progress_bar(desc: str, unit: str, quiet: bool) -> Iterator[Progress]:
    """A tqdm bar for a stage's long loop, shown on the main process unless `quiet`; the engine it is passed to
    sets its total."""
    from tqdm.auto import tqdm

    from arithmech import distributed

    with tqdm(desc=desc, unit=unit, disable=quiet or not distributed.is_main()) as bar:
        yield bar
