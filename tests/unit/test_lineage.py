"""lineage.stale_reason: which analyses belong to an identify run (fingerprint, created), table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from arithmech.lineage import stale_reason

NOW, EARLIER, LATER = "2026-01-02T10:00:00+0000", "2026-01-01T10:00:00+0000", "2026-01-03T10:00:00+0000"


def _run(fingerprint: str) -> dict[str, Any]:
    return {"path": "/runs/x", "fingerprint": fingerprint, "created": EARLIER}


CASES = [
    ("attention-of-this-run", {"stage": "analyze_attention", "identify_run": _run("aaa")}, False),
    ("attention-of-another-run", {"stage": "analyze_attention", "identify_run": _run("bbb")}, True),
    ("transfer-with-this-run-among-its-sources", {"stage": "transfer", "identify_runs": [_run("b"), _run("aaa")]},
     False),
    ("transfer-of-other-runs", {"stage": "transfer", "identify_runs": [_run("b"), _run("c")]}, True),
    ("knockout-of-named-components", {"stage": "knockout", "config": {"from_run": None}, "created": EARLIER}, False),
    ("full-finetune-reads-no-run", {"stage": "finetune", "config": {"method": "full", "from_run": "/r"},
                                    "created": EARLIER}, False),
    ("precise-finetune-of-another-run", {"stage": "finetune", "config": {"method": "precise", "from_run": "/r"},
                                         "identify_run": _run("bbb")}, True),
    ("mediation-reads-no-run", {"stage": "mediate", "created": EARLIER}, False),
    ("unrecorded-and-older", {"stage": "analyze-mlp", "created": EARLIER}, True),
    ("unrecorded-and-newer", {"stage": "analyze-mlp", "created": LATER}, False),
    ("unrecorded-and-undated", {"stage": "agreement"}, False),
    ("fourier-of-another-run", {"stage": "analyze-fourier", "identify_run": _run("bbb")}, True),
    ("fourier-unrecorded-and-older", {"stage": "analyze-fourier", "created": EARLIER}, True),
    ("unknown-stage-that-records-another-run", {"stage": "analyze-new", "identify_run": _run("bbb")}, True),
]  # fmt: skip


@pytest.mark.parametrize(("metadata", "stale"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_stale_reason(metadata: dict[str, Any], stale: bool) -> None:
    reason = stale_reason(metadata, "aaa", NOW)
    assert (reason is not None) == stale
    if stale:
        assert "identify run" in reason
