"""The verdict tests no paper owns: generic bars (`at_most`, `counts_at_most`, `drop_at_most`) and A's paired lead
over B that claims of both papers read (`a_leads`, on `_a_ahead`), each registered in `TESTS` where it is written."""

from __future__ import annotations

from workbench.analysis.claims.ledger import ALPHA, verdict_test
from workbench.defaults import INSTALL_BAR


@verdict_test
def drop_at_most(claim: dict, ours: dict) -> tuple[str, str]:
    drop = ours["drop"]
    return ("reproduced" if drop <= claim["max_drop"] else "not reproduced"), \
        f"drop {drop:+.2f} points (allowed {claim['max_drop']:g})"


def _a_ahead(p: dict) -> tuple[bool, str]:
    """Whether A is ahead of B on the paired rows (B hurt more than it helped, exact McNemar p < 0.05), and the counts."""
    return (p["b_hurt"] > p["b_helped"] and p["p_mcnemar"] < ALPHA,
            f"{p['a_correct']} vs {p['b_correct']} of {p['n']}: A alone right on {p['b_hurt']}, B alone on "
            f"{p['b_helped']} (exact McNemar p = {p['p_mcnemar']:.3g})")


@verdict_test
def a_leads(claim: dict, ours: dict) -> tuple[str, str]:
    """A (the specimen) ahead of B on the rows compared: B hurt more rows than it helped, exact McNemar p < 0.05."""
    ahead, how = _a_ahead(ours["compared"])
    return ("reproduced" if ahead else "not reproduced"), how


@verdict_test
def at_most(claim: dict, ours: dict) -> tuple[str, str]:
    return ("reproduced" if ours["value"] <= claim["bar"] else "not reproduced"), \
        f"{ours['value']:.2g} against the bar {claim['bar']:g}"


@verdict_test
def counts_at_most(claim: dict, ours: dict) -> tuple[str, str]:
    """Every count's share at most `bar` (a claim that something stays low, e.g. minimal zero-shot transfer), on a
    model that is not simply broken: where the measure reads its `competence` (the same model on rows it was
    trained for), that share must reach `min_competence` (default the installation bar), or "low" says nothing."""
    over = [f"{k}/{n}" for k, n in ours["counts"] if k / n > claim["bar"]]
    floor = claim.get("min_competence", INSTALL_BAR)
    broken = "competence" in ours and ours["competence"] < floor
    return ("reproduced" if not over and not broken else "not reproduced"), \
        (f"every share at most {claim['bar']:g}" + (f"; above it: {', '.join(over)}" if over else ": none above it")
         + (f"; competence {ours['competence']:.2f} against the floor {floor:g}"
            + (": low because the model reads nothing" if broken else "") if "competence" in ours else ""))
