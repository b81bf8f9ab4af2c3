"""Key components from path-patching effects (Zhang et al. 2024, section 4.1).

A component is key when its effect is below a threshold (default -5%: replacing its END output with the
counterfactual's lowers the answer logit by more than 5%), or, as an option for small models whose whole
counterfactual moves the logit little, when its effect is at least a given fraction of the whole-prompt
counterfactual effect. The top-k by effect (most negative first) are reported either way.

A share of a whole-prompt effect of exactly 0 is undefined: fraction_of_total is then None (null in
key_components.json, an empty cell in effects.csv), and the fraction rule is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from arithmech.errors import DataError
from arithmech.models.sites import Component


@dataclass(frozen=True)
class RankedComponent:
    """One component with its effect and its share of the whole-prompt counterfactual effect."""

    component: Component
    effect: float
    fraction_of_total: float | None
    """effect / whole-prompt effect; None when the whole-prompt effect is 0."""


@dataclass(frozen=True)
class KeyComponents:
    """The ranking and the two selections a user asks for."""

    ranked: list[RankedComponent]
    """All components, most negative effect first."""
    key: list[RankedComponent]
    """Components passing the threshold rule."""
    top_k: list[RankedComponent]
    rule: str
    total_effect: float
    why_none: str | None = None
    """When no component is key: the strongest one against the rule, and the setting that would change it."""

    def to_json(self) -> dict[str, object]:
        def rows(items: list[RankedComponent]) -> list[dict[str, object]]:
            return [
                {"component": r.component.name, "kind": r.component.kind, "effect": r.effect,
                 "fraction_of_total": r.fraction_of_total}
                for r in items
            ]

        return {
            "rule": self.rule,
            "total_effect": self.total_effect,
            "key": rows(self.key),
            "top_k": rows(self.top_k),
            "key_heads": [r.component.name for r in self.key if r.component.head is not None],
            "key_mlps": [r.component.name for r in self.key if r.component.head is None],
            "why_none": self.why_none,
        }


def rank_components(
    components: list[Component],
    effects: list[float],
    total_effect: float,
    threshold: float = -0.05,
    top_k: int = 10,
    fraction_threshold: float | None = None,
) -> KeyComponents:
    """Rank by effect and select key components by `threshold` or, if given, by `fraction_threshold`."""
    ranked = sorted(
        (
            RankedComponent(c, e, e / total_effect if total_effect != 0 else None)
            for c, e in zip(components, effects, strict=True)
        ),
        key=lambda r: r.effect,
    )
    if fraction_threshold is not None:
        if total_effect == 0:
            raise DataError(
                "the whole-prompt counterfactual effect is 0, so no component has a fraction of it; select key "
                "components by --threshold instead of --fraction-threshold"
            )
        key = [
            r for r in ranked
            if r.fraction_of_total is not None and r.fraction_of_total >= fraction_threshold and r.effect < 0
        ]  # fmt: skip
        share = f"{fraction_threshold:g} of the whole-prompt counterfactual effect"
        rule = f"effect >= {share} ({total_effect:+.2%})"
    else:
        key = [r for r in ranked if r.effect < threshold]
        rule = f"effect < {threshold:g}"
    why = None if key else why_none(ranked, total_effect, threshold, fraction_threshold)
    return KeyComponents(ranked=ranked, key=key, top_k=ranked[:top_k], rule=rule, total_effect=total_effect,
                         why_none=why)  # fmt: skip


def why_none(
    ranked: list[RankedComponent], total_effect: float, threshold: float, fraction_threshold: float | None
) -> str:
    """Why no component passes the rule: the strongest effect (or share) against the threshold, and the option to
    change (the CLI's name; the Python API's is the same with _ for -)."""
    if not ranked or ranked[0].effect >= 0:
        return ("no component lowers the answer's logit (the strongest effect is "
                f"{ranked[0].effect if ranked else 0.0:+.2%}), so the counterfactual prompts change nothing the "
                "model uses; check the prompts, or use more of them (--max-prompts)")  # fmt: skip
    best = ranked[0]
    if fraction_threshold is None:
        return (f"the strongest effect is {best.effect:+.2%} ({best.component.name}), not below the threshold "
                f"{threshold:+.2%}; give a threshold nearer 0, e.g. --threshold {best.effect / 2:.2g}, or select by "
                "share of the whole-prompt effect with --fraction-threshold 0.1")  # fmt: skip
    if total_effect >= 0:
        return (f"the whole-prompt counterfactual effect is {total_effect:+.2%}, so no component lowering the answer "
                "is a share of it; select key components by --threshold instead of --fraction-threshold")  # fmt: skip
    share = max((r.fraction_of_total or 0.0) for r in ranked if r.effect < 0)
    return (f"the largest share of the whole-prompt effect is {share:.2g} ({best.component.name}), below "
            f"--fraction-threshold {fraction_threshold:g}; give a lower one, e.g. --fraction-threshold {share / 2:.2g}")
