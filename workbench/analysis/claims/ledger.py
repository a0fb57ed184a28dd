"""The ledger's machinery: the claims file, the two registries (`MEASURES`, `TESTS`) the papers' modules fill
with `@measure` and `@verdict_test` where each function is written, the readers of a specimen's committed results,
the helpers both papers' measures share, and the ledger built from them and written (markdown, HTML, JSON)."""

from __future__ import annotations

import html
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pandas as pd
from scipy import stats as sps

from workbench.analysis.claims.nulls import admit
from workbench.analysis.results import read_table
from workbench.defaults import DATA, OLD_SWEEP_TABLE, SWEEP_TABLE, data_root
from workbench.errors import WorkbenchError
from workbench.guard import FILES, OutputKind
from workbench.io import write_bytes_atomic
from workbench.readers import read_json, read_toml, under_old_name

log = logging.getLogger(__name__)

CLAIMS_FILE = DATA / "claims.toml"
ROOT = data_root()   # the checkout's root, or an installed package's data: training/keepers/<specimen>
BATTERY = "battery"
ALPHA = 0.05
# "not shown": the rule's interval could not exclude its margin even for a model at parity with this discordance, so
# the rows read cannot decide it either way (an underpowered reading, not a miss)
VERDICTS = ("reproduced", "not reproduced", "not shown", "not comparable")


# The measures (specimen, claim) -> ours and the verdict tests (claim, ours) -> (verdict, how), each under its
# function's name, the name claims.toml gives as a claim's `measure` and `test`: filled by `@measure` and
# `@verdict_test` where each is written (`rules`, `retrofit`, `recurtrace`; the package imports every one).
MEASURES: dict[str, Callable[[Path, dict], dict]] = {}
TESTS: dict[str, Callable[[dict, dict], tuple[str, str]]] = {}
F = TypeVar("F", bound=Callable)
# A measure's old name -> its name: a claims file that gives the old one still reads, with a one-line note.
OLD_MEASURES = {"stage2_ablation": "window_sweep_ablation"}


def _register(registry: dict[str, Callable], kind: str, f: F) -> F:
    if f.__name__ in registry:
        raise ValueError(f"two claim {kind}s are named '{f.__name__}' ({registry[f.__name__].__module__} and "
                         f"{f.__module__})")
    registry[f.__name__] = f
    return f


def measure(f: F) -> F:
    """Registers a measure in `MEASURES` under its name (a second one of that name is refused)."""
    return _register(MEASURES, "measure", f)


def verdict_test(f: F) -> F:
    """Registers a verdict test in `TESTS` under its name (a second one of that name is refused)."""
    return _register(TESTS, "test", f)


def load_claims(path: str | Path = CLAIMS_FILE) -> list[dict]:
    """The claims of the data file, each checked for the keys every claim needs."""
    data = read_toml(path, "claims file")
    claims = data.get("claims", [])
    if not isinstance(claims, list) or not all(isinstance(c, dict) for c in claims):
        raise WorkbenchError(f"{path}: 'claims' must be an array of tables ([[claims]])")
    for c in claims:
        missing = [k for k in ("id", "paper", "section", "claim", "paper_value", "measure", "specimen", "test",
                               "rule", "setting", "paper_setting") if k not in c]
        if missing:
            raise WorkbenchError(f"{path}: claim '{c.get('id', '?')}' lacks '{missing[0]}'")
        if c["measure"] in OLD_MEASURES:
            log.warning("%s: claim '%s': measure '%s' read as '%s' (its old name)", path, c["id"], c["measure"],
                        OLD_MEASURES[c["measure"]])
            c["measure"] = OLD_MEASURES[c["measure"]]
        if c["measure"] not in MEASURES or c["test"] not in TESTS:
            raise WorkbenchError(f"{path}: claim '{c['id']}' names an unknown measure or test")
        if "like_for_like" in c:
            raise WorkbenchError(f"{path}: claim '{c['id']}' declares like_for_like; it is computed from the "
                                 "recorded settings against paper_setting")
    return claims


# ----------------------------------------------------------------------------- measures
class Missing(Exception):
    """A specimen or one of its result files is not there: the claim is not comparable (yet)."""


MAJORITY = "the majority answer"   # a null: the most frequent target (per depth where the rows have depths)


def _top(targets: pd.Series) -> str:
    """The most frequent target (ties to the first in sort order): the one answer a policy that reads nothing gives."""
    counts = targets.value_counts()
    return str(min(counts[counts == counts.max()].index))


def _gate(ours: dict, reason: str) -> None:
    """Marks a measured claim not comparable: the setting cannot answer it (`reason` says why)."""
    ours.setdefault("gates", []).append(reason)


def _results(specimen: Path, results: str = BATTERY) -> Path:
    folder = specimen / results
    if not (folder / "summary.json").is_file() and not (folder / "final.json").is_file():
        raise Missing(f"{specimen.relative_to(ROOT) if specimen.is_relative_to(ROOT) else specimen} has no "
                      f"{results}/summary.json (a battery) or {results}/final.json (scripts/final_answers.py)")
    return folder


def _table(specimen: Path, name: str, results: str = BATTERY) -> pd.DataFrame:
    path = _results(specimen, results) / f"{name}.parquet"
    if not path.is_file():
        raise Missing(f"no {results}/{name}.parquet")
    return read_table(path)


def _summary(specimen: Path, results: str = BATTERY) -> dict:
    return read_json(_results(specimen, results) / "summary.json", "summary")


# The halting results' readers, shared by both papers' halting claims.
def _halting(specimen: Path, claim: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the compute-accuracy curve, the chosen methods row by row) of a halting battery's results."""
    results = claim.get("results", "halting")
    return _table(specimen, "halting", results), _table(specimen, "halting__chosen", results)


def _pick(chosen: pd.DataFrame, method: str) -> pd.DataFrame:
    g = chosen[chosen["method"] == method].set_index("row_id")
    if g.empty:
        raise Missing(f"the halting results hold no '{method}' method")
    return g


def _spearman(loops: pd.Series, depths: pd.Series) -> float | None:
    """Spearman's rank correlation of the stopping loop with the row's depth (None when either is constant)."""
    if loops.nunique() < 2 or depths.nunique() < 2:
        return None
    return float(sps.spearmanr(loops.to_numpy(), depths.to_numpy()).statistic)


def _depth_tracking(g: pd.DataFrame) -> dict:
    rho = _spearman(g["loops"], g["depth"])
    at_d = float((g["loops"] == g["depth"]).mean())
    modal = g["loops"].value_counts()
    return {"spearman": rho, "at_depth": at_d, "modal_loop": int(modal.index[0]),
            "modal_share": float(modal.iloc[0] / len(g)),
            "text": f"Spearman(stopping loop, depth) = {'undefined (one stopping loop)' if rho is None else f'{rho:.2f}'}"
                    f", {at_d:.0%} of rows stop exactly at d"}


# ----------------------------------------------------------------------------- the ledger
def step_seconds(run: Path) -> tuple[float, str]:
    """Measured seconds per training step of a committed run (provenance wall_s / steps) and where it ran."""
    prov = read_json(run / "provenance.json", "provenance")
    if not prov.get("steps") or not prov.get("wall_s"):
        raise Missing(f"{run.name}'s provenance records no steps and wall time")
    hw = (prov.get("precision") or {}).get("hardware", {}).get("name", "this CPU")
    return prov["wall_s"] / prov["steps"], f"{run.name}: {prov['wall_s']:,.0f} s / {prov['steps']:,} steps on {hw}"


def comparable_cost(claim: dict, root: Path) -> str:
    """What would make a not-comparable claim comparable (`comparable_when`) and what it costs (`cost`: `steps` at
    the measured seconds per step of the run `like`, times `scale` for the bigger setting, plus `extra` in words)."""
    when = claim.get("comparable_when")
    if not when:
        return ""
    cost = claim.get("cost")
    if not cost:
        return f"comparable when {when}"
    parts = []
    if "steps" in cost:
        try:
            sps_, where = step_seconds(root / cost["like"])
        except (Missing, OSError) as gap:
            parts.append(f"step time unknown ({gap})")
        else:
            scale = cost.get("scale", 1.0)
            hours = cost["steps"] * sps_ * scale / 3600
            parts.append(f"{cost['steps']:,} steps x {sps_:.2f} s/step (measured, {where})"
                         + (f" x {scale:g} ({cost['scale_why']})" if scale != 1.0 else "")
                         + f" = about {hours:.1f} h of this 2-core CPU")
    if cost.get("extra"):
        parts.append(cost["extra"])
    return f"comparable when {when}; cost: {'; '.join(parts)}"


SETTING_KEYS = ("model", "N", "support", "counting")   # what a row's setting is compared on


def ours_setting(specimen: Path, claim: dict, root: Path) -> dict:
    """The recorded settings a row reads, from the run that trained what it measures: the claim's `stage1` when it
    names one (a halting head's Stage 1 model), else the specimen: the base model, the alphabet N, the support (the
    deepest depth of any training stage but halting) and how cells are counted (`counting`, declared: how our
    measure counts). A block selection or a window sweep records its model in its own JSON (and a sweep its
    curriculum and ranking depths)."""
    run = root / claim["stage1"] if "stage1" in claim else specimen
    out = {"counting": claim.get("counting", "every row")}
    recipe_file = run / "recipe.toml"
    if not recipe_file.is_file():
        # a block selection (block_selection.json) or a window sweep (sweep.json, its curriculum by name beside the
        # shipped recipes, and its runs cut to the sweep's budget: its table's ranking depths are the support)
        for record in ("sweep.json", "block_selection.json"):
            if (run / record).is_file():
                plan = read_json(run / record, record)
                out["model"] = plan.get("model")
                shipped = root / "training" / plan.get("recipe", "")
                if record == "sweep.json" and plan.get("recipe") and shipped.is_file():
                    out["N"] = read_toml(shipped, "recipe").get("task", {}).get("alphabet")
                if (table := under_old_name(run, SWEEP_TABLE, OLD_SWEEP_TABLE)).is_file():
                    depths = read_json(table, "window sweep table").get("rank_rows", {}).get("depths")
                    out["support"] = max(depths) if depths else None
                break
        return out
    recipe = read_toml(recipe_file, "recipe")
    out["model"] = recipe.get("model", {}).get("base")
    out["N"] = recipe.get("task", {}).get("alphabet")
    depths = [d for st in recipe.get("stages", []) if st.get("kind") != "halting" for d in st.get("depths", [])]
    out["support"] = max(depths) if depths else None
    return out


def setting_differences(specimen: Path, claim: dict, root: Path) -> list[str]:
    """What differs between our recorded setting and the paper's (`paper_setting`), key by key, over the keys the
    claim says bear on it (`setting_keys`, default all of SETTING_KEYS); a key the paper's side does not state, or
    ours does not record, counts as differing: like for like is shown, never assumed."""
    ours, paper = ours_setting(specimen, claim, root), claim["paper_setting"]
    out = []
    for key in claim.get("setting_keys", SETTING_KEYS):
        o, p = ours.get(key), paper.get(key)
        if o is None or p is None:
            out.append(f"{key}: ours {o if o is not None else 'not recorded'}, "
                       f"paper {p if p is not None else 'not stated'}")
        elif str(o).lower() != str(p).lower():
            out.append(f"{key}: ours {o}, paper {p}")
    return out


def run_nulls(claim: dict, ours: dict) -> dict[str, tuple[str, str]]:
    """{null name: (the verdict the claim's test gives it, its reading)} for each null reading a measure returns.

    A measure returns `ours["nulls"]` = {name: a reading shaped like `ours`}: what a policy that knows nothing
    (the majority answer, a head that always stops at loop 1, an untrained exit rule, a model that never
    installs...) reads on the same rows. Each goes through the same test; a null the test passes makes a
    reproduced row "not comparable" (`build_ledger`): a pass a trivial policy also earns says nothing of the model
    (a model that fails where a null passes has been told apart from it, and its miss stands). A null meets the
    same gates as the model: where its reading carries one (a null arm that never installs), it reads "not
    comparable", as the model's row would. Every null passes `nulls.admit` first, so no rule opts out: a null that
    is the comparator, a copy of the model's reading or written in, or a missing null the rule's kind requires,
    stops the ledger (`RefusedNull`).
    """
    admit(claim["test"], ours, ours.get("nulls", {}))
    out = {}
    for name, reading in ours.get("nulls", {}).items():
        verdict, how = TESTS[claim["test"]](claim, reading)
        if reading.get("gates"):
            verdict, how = "not comparable", f"{'; '.join(reading['gates'])} (the rule alone would read: {verdict})"
        out[name] = (verdict, f"{reading['text']}: {verdict}" + (f" ({how})" if verdict == "not comparable" else ""))
    return out


def build_ledger(claims_file: str | Path = CLAIMS_FILE, root: str | Path = ROOT) -> list[dict]:
    """One row per claim: id, paper, section, claim, paper_value, specimen, rule, ours, rows, comparison, verdict,
    reason (why in words), setting, comparable_when (with its cost; for a not-comparable row) and why (all of it)."""
    root = Path(root)
    rows = []
    for c in load_claims(claims_file):
        specimen = root / c["specimen"]
        row = {k: c[k] for k in ("id", "paper", "section", "claim", "paper_value", "specimen", "rule", "setting")}
        row["differs"] = setting_differences(specimen, c, root) if specimen.is_dir() else ["specimen not committed"]
        row["like_for_like"] = not row["differs"]
        try:
            if not specimen.is_dir():
                raise Missing(f"specimen {c['specimen']} is not committed")
            ours = MEASURES[c["measure"]](specimen, {**c, "_root": root})
            verdict, how = TESTS[c["test"]](c, ours)
            gates = list(ours.get("gates", []))
            nulls = run_nulls(c, ours)
            passing = [f"{name} ({text})" for name, (v, text) in nulls.items() if v == "reproduced"]
            if passing and verdict == "reproduced":   # a pass a policy that knows nothing also earns says nothing
                gates.append(f"a null meets this rule too, so the setting cannot tell the model from it: "
                             f"{'; '.join(passing)}")
            if c.get("not_comparable"):     # declared: what the setting cannot show, whatever the numbers
                gates.insert(0, c["not_comparable"])
            if gates:
                reason = "; ".join(gates) + f" (the rule alone would read: {verdict})"
                verdict = "not comparable"
            else:
                reason = how
            row.update(ours=ours["text"], rows=ours["rows"], comparison=how, verdict=verdict, reason=reason,
                       nulls=[{"null": name, "verdict": v, "reading": text} for name, (v, text) in nulls.items()])
        except Missing as gap:
            row.update(ours="-", rows=0, comparison="-", verdict="not comparable", reason=str(gap), nulls=[])
        row["comparable_when"] = comparable_cost(c, root) if row["verdict"] == "not comparable" else ""
        why = row["reason"] if row["like_for_like"] else \
            f"{row['reason']}; setting differs ({'; '.join(row['differs'])}): {c['setting']}"
        row["why"] = why + (f"; {row['comparable_when']}" if row["comparable_when"] else "")
        rows.append(row)
    return rows


def verdict_counts(rows: list[dict]) -> dict[str, dict[str, int]]:
    """{paper: {verdict: rows}} with every verdict present (0 where none), papers in order."""
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        out.setdefault(r["paper"], dict.fromkeys(VERDICTS, 0))[r["verdict"]] += 1
    return dict(sorted(out.items()))


PAPERS = {"000": "000 (retrofit paper)", "002": "002 (RecurTrace)"}


def counts_table(rows: list[dict]) -> list[str]:
    """The verdict counts per paper as markdown table lines (the README shows the same lines)."""
    lines = ["| paper | reproduced | not reproduced | not comparable | not shown | claims |", "|---|---|---|---|---|---|"]
    for paper, c in verdict_counts(rows).items():
        lines.append(f"| {PAPERS.get(paper, paper)} | {c['reproduced']} | {c['not reproduced']} | "
                     f"{c['not comparable']} | {c['not shown']} | {sum(c.values())} |")
    return lines


def ledger_markdown(rows: list[dict]) -> str:
    """The ledger as a markdown document (deterministic: the committed claims/LEDGER.md)."""
    out = ["# Claims ledger", "",
           "Generated by `workbench claims` from `workbench/data/claims.toml` and the committed specimens' "
           "battery results. Paper 000 is the retrofit paper, 002 RecurTrace. A verdict holds for the "
           "setting named in its row; rows whose setting differs from the paper's say so. Four verdicts: "
           "reproduced, not reproduced, not shown (the rows read cannot decide the rule: its interval could not "
           "exclude the margin even for a model at parity with the same discordance), and not comparable (the "
           "setting cannot answer the claim, or its results are not committed: the row says why, what the rule "
           "alone would read, what would make it comparable and what that costs). Every rule and its bar is "
           "declared in the data file, and every null a rule reads is drawn by the ledger's generator for its kind.", "",
           "| claim | paper | paper's number | ours | specimen (rows) | verdict |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        cell = lambda s: str(s).replace("|", "\\|")  # noqa: E731
        out.append(f"| {cell(r['claim'])} | {r['paper']} {cell(r['section'])} | {cell(r['paper_value'])} | "
                   f"{cell(r['ours'])} | `{r['specimen']}` ({r['rows']}) | **{r['verdict']}** |")
    out += ["", "## Verdicts per paper", "", *counts_table(rows), "", "## Why each verdict", ""]
    for r in rows:
        like = "like for like" if r["like_for_like"] else f"setting differs: {'; '.join(r['differs'])}"
        out.append(f"- **{r['id']}** ({r['verdict']}, {like}). Rule: {r['rule'].rstrip('.')}. Reading: {r['reason']}."
                   + (f" Nulls: {'; '.join(n['null'] + ' ' + n['reading'] for n in r['nulls'])}." if r["nulls"] else "")
                   + ("" if r["like_for_like"] else f" Setting: {r['setting']}.")
                   + (f" {r['comparable_when'][0].upper()}{r['comparable_when'][1:]}." if r["comparable_when"] else ""))
    return "\n".join(out) + "\n"


def ledger_html(rows: list[dict]) -> str:
    """The ledger as one self-contained HTML page (no script)."""
    e = html.escape
    body = "".join(
        f"<tr><td>{e(r['claim'])}</td><td>{e(r['paper'])} {e(r['section'])}</td><td>{e(r['paper_value'])}</td>"
        f"<td>{e(r['ours'])}</td><td><code>{e(r['specimen'])}</code> ({e(str(r['rows']))})</td>"
        f"<td class='{e(r['verdict'].replace(' ', '-'))}'>{e(r['verdict'])}</td><td>{e(r['rule'])}</td>"
        f"<td>{e(r['why'])}</td></tr>"
        for r in rows)
    return ("<!doctype html><html><head><meta charset='utf-8'><title>Claims ledger</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
            "padding:4px 8px;vertical-align:top}.reproduced{background:#e6f4ea}.not-reproduced{background:#fce8e6}"
            ".not-comparable{background:#f1f3f4}.not-shown{background:#fef7e0}</style></head><body><h1>Claims ledger</h1>"
            "<table><tr><th>claim</th><th>paper</th><th>paper's number</th><th>ours</th><th>specimen (rows)</th>"
            f"<th>verdict</th><th>rule</th><th>why</th></tr>{body}</table></body></html>\n")


LEDGER_FILES = ("LEDGER.md", "ledger.html", "ledger.json")  # what `write_ledger` writes


def ledger_file(path: Path) -> bool:
    """Whether `path` is one of the ledger's files that the workbench wrote, told from its content: LEDGER.md's
    title, ledger.json's rows with a verdict each, ledger.html's title."""
    try:
        head = path.read_bytes()[:1 << 16] if path.suffix != ".html" else path.read_bytes()
    except OSError:
        return False
    if path.name == "LEDGER.md":
        return head.startswith(b"# Claims ledger") or b"workbench claims" in head
    if path.name == "ledger.json":
        try:
            rows = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return False
        return isinstance(rows, list) and all(isinstance(r, dict) and "verdict" in r for r in rows)
    return path.name.endswith(".html") and b"<title>Claims ledger</title>" in head


# What `claims --out` writes, handed to the output gate: LEDGER_FILES in one directory, each replaced only when it
# is a ledger the workbench wrote.
LEDGER_OUTPUT = OutputKind("ledger", FILES, owns=ledger_file)


def write_ledger(out: str | Path, rows: list[dict]) -> list[Path]:
    """Writes LEDGER.md, ledger.html and ledger.json into `out`; returns their paths."""
    out = Path(out)
    files = {"LEDGER.md": ledger_markdown(rows), "ledger.html": ledger_html(rows),
             "ledger.json": json.dumps(rows, indent=1, sort_keys=True) + "\n"}
    for name, text in files.items():
        write_bytes_atomic(out / name, text.encode())
    return [out / n for n in files]
