"""The ledger's nulls: one generator per rule kind, and the gate every null passes (`admit`) before a rule reads it.

A null is a policy that knows nothing the rule compares, read on the same rows through the same test and gates
(`ledger.run_nulls`). What it may know is the setting: the depth a prompt states, how often the head stops at each
loop, the answers' frequencies. A rule the setting decides shows there: a null that reads only the setting passes.

The generators, per rule kind (`REQUIRED` names what each verdict test must read):

- halting and exit rules: the prompt-reading policy (stop at the depth the prompt states), a seeded random stop
  drawn from the head's own stops (same loop distribution, no row-wise choice), every fixed depth but the
  comparator's, and the untrained exit of the same table;
- "falls after its peak": a model that parks (each row holds the first answer it got right);
- "each step at its loop": each edited step entering at a seeded random loop;
- "stays low": chance and the majority answer.

`admit` refuses a null that cannot tell the rule anything: one with 0 discordant rows against the comparator (it
is the comparator), a copy of the model's own reading (or of one of its curves), a modal share written in rather
than read from the null's stops, and a rule kind read without a null it requires. A policy that merely comes out
as the model does (a head that stops where the prompt says) is admitted: that is a finding, which the gates
read. A refused null is a fault of the
measure that built it, so the ledger is not written (`RefusedNull`).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from workbench.errors import WorkbenchError

SEED = 0   # every random null draws from this seed, so the ledger regenerates byte for byte

PROMPT, RANDOM, FIXED, UNTRAINED = "prompt", "random stop", "fixed depth", "untrained exit"
PARKS, ENTRY, MAJORITY_KIND, CHANCE = "parks", "random entry", "majority", "chance"

# The null kinds each verdict test must read; a row whose measure omits one is refused, not judged.
_STOPPING = (PROMPT, RANDOM, FIXED, UNTRAINED)
REQUIRED: dict[str, tuple[str, ...]] = {
    "head_beats_fixed": _STOPPING,
    "head_matches_fixed_with_fewer_loops": _STOPPING,
    "wall_below_fixed": _STOPPING,
    "collapses_to_one": (UNTRAINED,),
    "falls_after_peak": (PARKS,),
    "each_step_at_its_loop": (ENTRY,),
    "counts_at_most": (CHANCE, MAJORITY_KIND),
}


class RefusedNull(WorkbenchError):
    """A null the ledger refuses to read: it is the comparator, a copy of the model, or written in."""


# ----------------------------------------------------------------------------- stopping policies
STATED = re.compile(r"apply the table (\d+) times?\b")   # the chase template writes each row's depth so


def stated_depth(prompt: str) -> int | None:
    """The depth a prompt states in words a reader with no model can parse, or None."""
    m = STATED.search(prompt)
    return int(m.group(1)) if m else None


def stop_policies(head: pd.DataFrame, rows: pd.DataFrame, prompts: pd.Series, untrained: pd.DataFrame | None,
                  untrained_name: str, comparator: int | None = None,
                  seed: int = SEED) -> dict[str, tuple[str, pd.DataFrame]]:
    """{null name: (kind, the policy's stops)} for a halting or exit rule: frames like `head` (row_id index, `depth`,
    `loops`, `correct`), each row's correctness read at its stop from `rows` (correctness [row, loop]).

    Args:
        head: the model's head at its chosen threshold, row by row.
        rows: every fixed depth's correctness on the same rows.
        prompts: each row's prompt, by row id (the prompt-reading policy stops at the depth it states, and at once,
            loop 1, where it states none: it reads nothing else).
        untrained: the untrained exit of the same table (None: the table holds none, and the row is refused).
        untrained_name: the exit's method name.
        comparator: the fixed depth the rule compares with (left out: it is the comparator).
        seed: the random stop's seed.
    """
    budget = int(max(rows.columns))
    stated = np.array([min(stated_depth(prompts[i]) or 1, budget) for i in head.index])
    out = {"the prompt-reading policy (stops at the depth the prompt states)": (PROMPT, _at(head, rows, stated)),
           f"a random stop drawn from the head's stops (seed {seed})":
           (RANDOM, _at(head, rows, np.random.default_rng(seed).permutation(head["loops"].to_numpy())))}
    for k in rows.columns:
        if int(k) != comparator:
            out[f"a fixed depth k = {int(k)} (no head)"] = (FIXED, _at(head, rows, np.full(len(head), int(k))))
    if untrained is not None:
        out[f"the untrained {untrained_name} exit"] = (UNTRAINED, untrained.loc[head.index])
    return out


def _at(head: pd.DataFrame, rows: pd.DataFrame, loops: np.ndarray) -> pd.DataFrame:
    """`head` stopped at `loops` (one per row), each row right as the fixed-depth reading at that loop."""
    loops = loops.astype(int)
    right = rows.to_numpy()[np.arange(len(rows)), [rows.columns.get_loc(k) for k in loops]]
    return head.assign(loops=loops, correct=right.astype(bool))


def prompt_matches_oracle(prompt: pd.DataFrame, oracle: pd.DataFrame) -> bool:
    """Whether the prompt-reading policy is right on every row the oracle (each row's first right loop) is: then
    the depth written in the prompt, not a head, decides where to stop, and no stopping rule can show more."""
    return bool((prompt["correct"].astype(bool) | ~oracle.loc[prompt.index, "correct"].astype(bool)).all())


def modal_share(stops) -> float:
    """The share of rows at the most frequent stopping loop, read from the stops themselves."""
    counts = pd.Series(list(stops)).value_counts()
    return float(counts.iloc[0] / counts.sum())


# ----------------------------------------------------------------------------- other rule kinds
def parked(rows: pd.DataFrame) -> pd.DataFrame:
    """Correctness [row, loop] of a model that parks: each row holds the first answer it got right."""
    return rows.astype(bool).cummax(axis=1)


def random_entries(curves: dict[int, pd.DataFrame], seed: int = SEED) -> dict[int, pd.DataFrame]:
    """Each step's patching curve for a model whose step k enters at a loop drawn at random (seeded, uniform over
    the loops read): recovered 1 from that loop on and 0 before it, each cell's interval as wide as the model's
    widest (the noise of these pairs, not their reading)."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, at in sorted(curves.items()):
        entry = int(rng.choice(at.index.to_numpy()))
        half = float((at["high"] - at["low"]).max() / 2)
        value = (at.index >= entry).astype(float)
        out[k] = at.assign(recovered=value, low=value - half, high=value + half)
    return out


def chance(counts: list[tuple[int, int]], answers: int) -> list[tuple[int, int]]:
    """(right, rows) of a uniform random answerer over `answers` possible answers, in expectation, per count."""
    return [(round(n / answers), n) for _, n in counts]


# ----------------------------------------------------------------------------- the gate
def admit(test: str, ours: dict, nulls: dict[str, dict]) -> None:
    """Refuses (`RefusedNull`) the nulls a rule must not read, and a rule read without a null its kind requires."""
    kinds = {r.get("kind") for r in nulls.values()}
    missing = [k for k in REQUIRED.get(test, ()) if k not in kinds]
    if missing:
        raise RefusedNull(f"the '{test}' rule reads no '{missing[0]}' null (it requires {', '.join(REQUIRED[test])})")
    for name, reading in nulls.items():
        why = refusal(ours, reading)
        if why:
            raise RefusedNull(f"the null '{name}' is refused: {why}")


def refusal(ours: dict, reading: dict) -> str | None:
    """Why `admit` refuses one null against the model's reading `ours`, or None."""
    for key in ("compared", "fall"):
        p = reading.get(key)
        if p is not None and p["b_helped"] + p["b_hurt"] == 0:
            return f"0 discordant rows against the comparator ({key}): it is the comparator"
    if "modal_share" in reading and ("stops" not in reading or reading["modal_share"] != modal_share(reading["stops"])):
        return "a modal share written in, not read from its stops"
    model_curves = list(ours.get("curves", {}).values())
    copied = [k for k, c in reading.get("curves", {}).items() if c in model_curves]
    if copied:
        return f"step {copied[0]}'s curve is one of the model's own curves (a copy of the model's reading)"
    return None

