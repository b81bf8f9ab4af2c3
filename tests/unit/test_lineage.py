"""lineage.stale_reason: which analyses belong to an identify run (fingerprint, created), table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from arithmech.lineage import stale_reason

NOW, EARLIER, LATER = "2026-01-02T10:00:00+0000", "2026-01-01T10:00:00+0000", "2026-01-03T10:00:00+0000"


def _run(fingerprint: str) -> dict[str, Any]:
    return {"path": "/runs/x", "fingerprint": fingerprint, "created": EARLIER}


CASES = [
    ("attention-of-this-run", {"stage": "analyze_attention", "identify_runs": [_run("aaa")]}, False),
    ("attention-of-another-run", {"stage": "analyze_attention", "identify_runs": [_run("bbb")]}, True),
    ("transfer-with-this-run-among-its-sources", {"stage": "transfer", "identify_runs": [_run("b"), _run("aaa")]},
     False),
    ("transfer-of-other-runs", {"stage": "transfer", "identify_runs": [_run("b"), _run("c")]}, True),
    ("knockout-of-named-components", {"stage": "knockout", "identify_runs": [], "created": EARLIER}, False),
    ("full-finetune-reads-no-run", {"stage": "finetune", "config": {"method": "full", "from_run": "/r"},
                                    "identify_runs": [], "created": EARLIER}, False),
    ("precise-finetune-of-another-run", {"stage": "finetune", "identify_runs": [_run("bbb")]}, True),
    ("mediation-reads-no-run", {"stage": "mediate", "identify_runs": [], "created": EARLIER}, False),
    ("unknown-stage-that-records-another-run", {"stage": "analyze-new", "identify_runs": [_run("bbb")]}, True),
    ("unknown-stage-that-reads-none", {"stage": "analyze-new", "identify_runs": [], "created": EARLIER}, False),
    # records of 2026-12-01: one run, or null, under identify_run
    ("dec-01-attention-of-this-run", {"stage": "analyze_attention", "identify_run": _run("aaa")}, False),
    ("dec-01-fourier-of-another-run", {"stage": "analyze-fourier", "identify_run": _run("bbb")}, True),
    ("dec-01-circuit-without-a-run", {"stage": "circuit", "identify_run": None, "created": EARLIER}, False),
    # records that do not say what they read: stale when older than the identify run, whatever their stage
    ("unrecorded-and-older", {"stage": "analyze-mlp", "created": EARLIER}, True),
    ("unrecorded-mediation-and-older", {"stage": "mediate", "created": EARLIER}, True),
    ("unrecorded-and-newer", {"stage": "analyze-mlp", "created": LATER}, False),
    ("unrecorded-and-undated", {"stage": "agreement"}, False),
    ("unreadable-record-and-older", {"stage": "knockout", "identify_runs": [{"path": "/x"}], "created": EARLIER},
     True),
    ("unreadable-list-and-older", {"stage": "knockout", "identify_runs": "/x", "created": EARLIER}, True),
]  # fmt: skip


@pytest.mark.parametrize(("metadata", "stale"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_stale_reason(metadata: dict[str, Any], stale: bool) -> None:
    reason = stale_reason(metadata, "aaa", NOW)
    assert (reason is not None) == stale
    if stale:
        assert "identify run" in reason
