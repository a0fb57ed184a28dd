"""Synthetic probe results that follow the probe schemas exactly (column names, dtypes, ranges).

The numbers are drawn from a seeded generator with known structure (accuracy that falls with
depth, a target symbol that rises with the loop), so tests can assert what a figure shows.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.analysis.stats import frontier

SYMBOLS = list("ABCDEFGHIJKLMNOP")
BLOCK = (10, 16)


def _chain(rng, depth: int) -> list[str]:
    return list(rng.choice(SYMBOLS, size=depth + 1, replace=False))


def depth_matrix(rng, depths=range(1, 9), per_depth: int = 12, loops: int = 8) -> pd.DataFrame:
    """One row per (row_id, loop); the chance of a correct read falls with depth and with t."""
    out = []
    for d in depths:
        for r in range(per_depth):
            chain = _chain(rng, d)
            for t in range(1, loops + 1):
                p = max(0.05, 1.0 - 0.09 * d - 0.02 * t)
                target = chain[min(t, d)]
                ok = bool(rng.random() < p)
                # Past the depth there is no label: the probe writes NA (a nullable boolean column).
                out.append(dict(row_id=f"d{d}-{r}", depth=d, loop=t, target=target if t <= d else None,
                                predicted=target if ok else chain[0], correct=ok if t <= d else pd.NA))
    return pd.DataFrame(out).astype({"correct": "boolean"})


def frontier_table(dm: pd.DataFrame) -> pd.DataFrame:
    """The depth_matrix__frontier part, computed from the matrix like the probe does."""
    diag = dm[dm["loop"] == dm["depth"]].groupby("depth")["correct"].mean()
    support = int(dm["depth"].max())
    rows = []
    for bar in (0.60, 0.71, 0.80):
        f = frontier(diag, bar=bar)
        rows.append(dict(bar=bar, frontier=f, support=support, frontier_over_support=f / support))
    return pd.DataFrame(rows)


def logit_lens(rng, depths=(2, 3, 4), per_depth: int = 3, loops: int = 5) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The logit_lens table and its __top part for three lenses; x_t peaks at loop t."""
    rows, top = [], []
    for d in depths:
        for r in range(per_depth):
            chain = _chain(rng, d)
            rid = f"d{d}-{r}"
            for t in range(1, loops + 1):
                for lens in ("coda", "raw", "tuned"):
                    logits = np.array([3.0 * (k == min(t, d)) + rng.normal(0, 0.3) for k in range(1, d + 1)])
                    prob = np.exp(logits) / (np.exp(logits).sum() + 5.0)
                    ranks = (-prob).argsort().argsort()
                    for k in range(1, d + 1):
                        rows.append(dict(row_id=rid, depth=d, loop=t, lens=lens, chain_index=k, symbol=chain[k],
                                         rank=int(ranks[k - 1]), prob=float(prob[k - 1])))
                    words = [f" {chain[min(t, d)]}", " the", "\n", " <b>", " A"]
                    probs = np.sort(rng.dirichlet(np.ones(5)))[::-1] * 0.9
                    for k, (w, p) in enumerate(zip(words, probs)):
                        top.append(dict(row_id=rid, loop=t, lens=lens, k=k, token=w, prob=float(p)))
    return pd.DataFrame(rows), pd.DataFrame(top)


def overshoot(rng, depths=(1, 2, 3), per_depth: int = 10, loops: int = 6) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The overshoot table (every 7th entry marked `coincide`) and its __cost part."""
    out = []
    for d in depths:
        for r in range(per_depth):
            chain = _chain(rng, d)
            for t in range(d + 1, loops + 1):
                cls = rng.choice(["iterate", "park", "other"], p=[0.2, 0.7, 0.1])
                out.append(dict(row_id=f"d{d}-{r}", depth=d, loop=t, extra=t - d,
                                predicted=chain[-1] if cls == "park" else "Z", iterate_symbol="Q",
                                park_symbol=chain[-1], cls=str(cls), coincide=len(out) % 7 == 0))
    df = pd.DataFrame(out)
    cost = (df.assign(answer=df["cls"] == "park", it=df["cls"] == "iterate").groupby(["depth", "extra"])
              .agg(n=("row_id", "size"), answer_acc=("answer", "mean"), iterate_acc=("it", "mean")).reset_index())
    return df, cost


SPLICE_CLASSES = ["source_orbit", "lawful", "shortcut", "other"]


def splice(rng, pairs: int = 8) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The splice table (three sites at the read span, the state also at all positions; j = 0 always
    coincides) and its __verdict part."""
    out = []
    for site, p in (("state", [0.1, 0.8, 0.05, 0.05]), ("block_resid", [0.3, 0.4, 0.2, 0.1]),
                    ("reentry_input", [0.05, 0.1, 0.8, 0.05])):
        for span in ("all", "read") if site == "state" else ("read",):  # "all" runs at the state only
            for k0 in (1, 2):
                for pair in range(pairs):
                    for j in (0, 1, 2, 3):
                        cls = "source_orbit" if j == 0 else str(rng.choice(SPLICE_CLASSES, p=p))
                        out.append(dict(pair_id=pair, row_a=f"a{pair}", row_b=f"b{pair}", depth=5, site=site,
                                        span=span, k0=k0, j=j, loop=k0 + j, predicted="C", cls=cls,
                                        coincide=j == 0 or (pair == 0 and j == 1)))
    df = pd.DataFrame(out)
    verdicts = []
    for (site, span, k0), g in df[~df["coincide"]].groupby(["site", "span", "k0"]):
        frac = g["cls"].value_counts(normalize=True).reindex(SPLICE_CLASSES, fill_value=0.0)
        verdict = ("source_orbit" if frac["source_orbit"] >= 0.75 else "lawful" if frac["lawful"] >= 0.75
                   else "shortcut" if frac["shortcut"] >= 0.5 else "mixed")
        verdicts.append(dict(site=site, span=span, k0=k0, verdict=verdict, **frac.to_dict(), n=len(g)))
    return df, pd.DataFrame(verdicts)


def heads(rng, loops: int = 4, rows: int = 6, heads_per_layer: int = 9) -> tuple[pd.DataFrame, pd.DataFrame]:
    out = []
    for t in range(1, loops + 1):
        for r in range(rows):
            for layer in range(*BLOCK):
                for h in range(heads_per_layer):
                    special = (layer, h) == (12, (3 + t) % heads_per_layer)
                    mass = 0.6 if special else float(rng.uniform(0, 0.1))
                    out.append(dict(row_id=f"r{r}", loop=t, layer=layer, head=h, target_mass=mass,
                                    table_mass=min(1.0, mass + float(rng.uniform(0, 0.3)))))
    df = pd.DataFrame(out)
    s = df.groupby(["loop", "layer", "head"])["target_mass"].mean().reset_index()
    s["retrieval_frac"] = (s["target_mass"] > 0.3).astype(float)
    s["is_retrieval"] = s["retrieval_frac"] >= 0.5
    s["share"] = s["target_mass"] / s.groupby("loop")["target_mass"].transform("sum")
    s["concentration"] = s.groupby("loop")["share"].transform(lambda x: float((np.sort(x)[-2:] ** 2).sum()))
    s["null_p95"] = 0.01
    return df, s.drop(columns="target_mass")


def linear_probe(rng, loops: int = 5) -> pd.DataFrame:
    out = []
    for site in ("state", "block.12", "block.14"):
        for target in ("x_prev", "x_t", "x_next"):
            for t in range(1, loops + 1):
                out.append(dict(loop=t, site=site, target=target, accuracy=float(rng.uniform(0.3, 1.0)),
                                null_p95=0.12, chance=0.0625, n_train=96, n_test=32))
    return pd.DataFrame(out)


def drift(rng, loops: int = 6, k: int = 4) -> tuple[pd.DataFrame, pd.DataFrame]:
    out = []
    for comparison in ("consecutive", "vs_loop1"):
        for t in range(2, loops + 1):
            for i in range(k):
                out.append(dict(loop=t, comparison=comparison, angle_index=i,
                                angle_deg=float(np.clip(10 * t + 5 * i + rng.normal(0, 2), 0, 90))))
    conc = pd.DataFrame(dict(loop=range(2, loops + 1), top3_share=np.linspace(0.5, 0.8, loops - 1),
                             null_p95=0.4, null_mean=0.33, residual_frac=0.5))
    shares = rng.dirichlet(np.ones(9), size=loops - 1)
    heads = pd.DataFrame([dict(loop=t, layer=BLOCK[1] - 1, head=h, share=float(shares[t - 2, h]))
                          for t in range(2, loops + 1) for h in range(9)])
    return pd.DataFrame(out), conc, heads


def halting() -> pd.DataFrame:
    rows = [dict(method="head", threshold=th, mean_loops=2 + 4 * th, accuracy=0.5 + 0.4 * th, chosen=th == 0.7)
            for th in (0.1, 0.3, 0.5, 0.7, 0.9)]
    rows += [dict(method="fixed_k", threshold=np.nan, mean_loops=float(k), accuracy=0.3 + 0.1 * k, chosen=k == 6)
             for k in (2, 4, 6)]
    rows += [dict(method="oracle", threshold=np.nan, mean_loops=3.1, accuracy=0.95, chosen=True),
             dict(method="act", threshold=0.5, mean_loops=4.2, accuracy=0.7, chosen=True)]
    return pd.DataFrame(rows)


def halting_difficulty() -> pd.DataFrame:
    return pd.DataFrame([dict(method=m, threshold=np.nan, group=g, n=10, mean_loops=loops, accuracy=0.5)
                         for m, g, loops in (("head", "hard", 4.5), ("head", "easy", 2.0), ("oracle", "hard", 3.0),
                                             ("oracle", "easy", 1.0))])


def gradient_audit(rng, loops: int = 4) -> tuple[pd.DataFrame, pd.DataFrame]:
    df = pd.DataFrame([dict(loop=t, group=g, grad_rms=float(s * 0.7 ** t))
                       for t in range(1, loops + 1) for g, s in (("reentry", 1e-3), ("block", 1e-2), ("coda", 3e-2))])
    fd = pd.DataFrame([dict(direction=i, autograd=0.5, finite_difference=0.5001, rel_error=2e-4) for i in range(3)])
    return df, fd


def latency() -> pd.DataFrame:
    rows = [dict(what="loops", loops=t, seconds=0.1 * t, ratio=0.9 * t, predicted_ratio=float(t)) for t in (1, 2, 4, 8)]
    rows += [dict(what="forced_read", loops=t, seconds=0.2, ratio=1.0, predicted_ratio=1.0) for t in (4, 8)]
    rows += [dict(what="reruns", loops=t, seconds=0.2 * t, ratio=t / 2, predicted_ratio=t / 1.8) for t in (4, 8)]
    return pd.DataFrame(rows)


def identity() -> pd.DataFrame:
    return pd.DataFrame([dict(variant="fresh", reentry=r, memory=m, lora=lo, max_abs_diff=0.0)
                         for r in ("bridge", "inject") for m in (False, True) for lo in (False, True)])


def loop_accuracy(dm: pd.DataFrame) -> pd.DataFrame:
    """The final answer read after every loop: right from loop d on where the depth matrix's diagonal is right."""
    final = dm[dm["loop"] == dm["depth"]].set_index("row_id")["correct"].astype(bool)
    rows = dm[["row_id", "depth", "loop"]].drop_duplicates()
    right = rows["row_id"].map(final) & (rows["loop"] >= rows["depth"])
    return rows.assign(predicted=np.where(right, "A", "B"), correct=right.to_numpy()).reset_index(drop=True)


def loop_dynamics(rng, loops: int = 6, per_depth: int = 4) -> dict[str, pd.DataFrame]:
    """lens_agreement, dynamics and exit_rules tables made by the probes' own table functions from planted arrays:
    the coda lens reads x_t, the logit lens does half the time; states contract at rate 0.6 per pass."""
    from workbench.probes import dynamics as dyn
    from workbench.probes import exit_rules as ex
    from workbench.probes import lens_agreement as la

    symbols = SYMBOLS[:8]
    rows = [dict(row_id=f"r{d}-{i}", depth=d, symbols=symbols, chain=[symbols[(i + t) % 8] for t in range(1, d + 1)],
                 answer=symbols[(i + d) % 8]) for d in (1, 2, 3) for i in range(per_depth)]
    E, C = len(rows), 8
    logits = {lens: rng.normal(size=(E, loops, C)) for lens in la.LENSES}
    for e, r in enumerate(rows):
        for t in range(1, loops + 1):
            x = symbols.index(r["chain"][t - 1]) if t <= r["depth"] else int(rng.integers(C))
            logits["coda"][e, t - 1, x] += 6
            if rng.random() < 0.5:
                logits["logit"][e, t - 1, x] += 6
    main, pairs = la.agreement_tables(rows, logits)
    causal = pd.DataFrame([dict(row_a=r["row_id"], row_b=rows[(e + 1) % E]["row_id"], depth=r["depth"], loop=1, j=j,
                                disagree="logit-coda" if e % 2 else "tuned", logit="A", coda="B", tuned="B",
                                predicted="C" if e % 4 else "D", expect_logit="D",
                                expect_coda="C", expect_tuned="C", carried_logit=e % 4 == 0, carried_coda=e % 4 != 0,
                                carried_tuned=e % 4 != 0, coincide=e == 0) for e, r in enumerate(rows) for j in (0, 1)],
                          columns=la.CAUSAL_COLUMNS)
    out = {"lens_agreement": main, "lens_agreement__pairs": pairs,
           "lens_agreement__summary": la.summary_table(main, pairs), "lens_agreement__causal": causal,
           "lens_agreement__identity": pd.DataFrame([dict(rows=4, max_abs_diff=1e-6, max_abs_logit=20.0,
                                                          tolerance=1e-4, holds=True)])}
    v = rng.normal(size=(E, 1, 5))
    steps, per_row = [], []
    for layer, rate in ((10, 0.8), (11, 0.6)):
        h = 3.0 + rate ** np.arange(1, loops + 1)[None, :, None] * v
        a, b = dyn.layer_tables(rows, h, layer, 0.1, 2)
        steps.append(a)
        per_row.append(b)
    js = {10: np.abs(rng.normal(size=(E, loops - 1, 3))) * 0.1, 11: np.abs(rng.normal(size=(E, loops - 1, 3))) * 0.05}
    out.update({"dynamics": pd.concat(steps, ignore_index=True), "dynamics__rows": pd.concat(per_row, ignore_index=True),
                "dynamics__heads": dyn.heads_table(js)})
    p = np.full((E, loops, C), 0.05)
    for e, r in enumerate(rows):
        ans = symbols.index(r["answer"])
        for t in range(1, loops + 1):
            p[e, t - 1, ans if t >= r["depth"] else (ans + t) % C] = 0.6 if t == r["depth"] else 0.9 if t > r["depth"] else 0.5
    stats = ex.statistics(np.log(p), rng.normal(size=(E, loops, 4)).cumsum(1), np.array([symbols.index(r["answer"])
                                                                                          for r in rows]))
    cal = np.arange(E) % 2 == 0
    depths = ex.sweep_depths(stats, loops, 1, ["max_prob", "stable"], {}, cal)
    depths["fixed_k"] = {float(k): np.full(E, k) for k in range(1, loops + 1)}
    depths["oracle"] = {np.nan: np.where(stats["correct"].any(1), stats["correct"].argmax(1) + 1, 1)}
    table = ex.curve_table(depths, stats["correct"], cal, 1, stats["predicted"])
    matched, tests = ex.match_and_test(table, depths, stats["correct"], cal, ["max_prob", "stable"], ["fixed_k"])
    out.update({"exit_rules": table, "exit_rules__matched": matched, "exit_rules__test": tests,
                "exit_rules__rows": ex.rows_table(rows, stats, cal, loops)})
    return out


def patching(rng, loops: int = 3, layers=(10, 11, 12), pairs: int = 4) -> dict[str, pd.DataFrame]:
    """The patching, attribution and paths tables: recovery concentrated at the last loop's read position."""
    positions, components = ["edited", "entries", "start", "question", "read"], ["resid", "attn", "mlp"]
    rows = []
    for pid in range(pairs):
        corruption = "entry" if pid % 2 == 0 else "start"
        for t in range(1, loops + 1):
            for i in layers:
                for pos in positions:
                    if corruption == "start" and pos == "start":
                        continue
                    for comp in components:
                        share = (0.9 if (pos == "read" and t == loops) or (pos == "edited" and comp == "resid") else 0.05)
                        rows.append(dict(pair_id=pid, row_id=f"r{pid // 2}", depth=loops, corruption=corruption,
                                         step=0 if corruption == "start" else 1 + pid % loops, loop=t, layer=i,
                                         position=pos, component=comp, n_positions=3,
                                         ld_patched=-4 + 8 * (share + 0.05 * rng.standard_normal()), ld_clean=4.0,
                                         ld_corrupted=-4.0))
    frame = pd.DataFrame(rows)
    keys = ["corruption", "loop", "layer", "position", "component"]
    g = frame.groupby(keys, as_index=False).agg(ld=("ld_patched", "mean"), n=("pair_id", "size"))
    g["recovered"] = (g["ld"] + 4) / 8
    g["low"], g["high"] = g["recovered"] - 0.1, g["recovered"] + 0.1
    grid = g.drop(columns="ld")
    steps = pd.DataFrame([dict(step=k, loop=t, recovered=float(t >= k), low=float(t >= k) - 0.1,
                               high=float(t >= k) + 0.1, n=2) for k in range(1, loops + 1) for t in range(1, loops + 1)])
    check = grid[keys].copy()
    check["exact"] = grid["recovered"]
    check["gradient"] = grid["recovered"] * 0.8 + 0.02 * rng.standard_normal(len(grid))
    routes = pd.DataFrame([dict(corruption=c, route=r, source=t, read=u, recovered=(0.9 if r != "readout" else 0.1),
                                low=0.0, high=1.0, n=2)
                           for c in ("entry", "start") for r in ("loops", "loops_read", "readout")
                           for t in range(1, loops) for u in range(t + 1, loops + 1)])
    paths = routes.assign(pair_id=0, row_id="r0", depth=loops, step=1, ld_patched=0.0, ld_clean=1.0,
                          ld_corrupted=-1.0).rename(columns={"source": "source"})
    pairs_table = frame.drop_duplicates("pair_id")[["pair_id", "row_id", "depth", "corruption", "step", "ld_clean",
                                                    "ld_corrupted"]].assign(edited="A -> B -> C", clean_answer="B",
                                                                            corrupted_answer="C")
    agreement = pd.DataFrame([dict(corruption=c, component=k, cells=45, pairs=1, cleared=12, spearman=0.85, p=0.0003,
                                   sign_share=1.0, top10=8, top_k=10, verdict="trusted", reason="", trusted=True)
                              for c in ("entry", "start") for k in ("all", "attn", "mlp", "resid")])
    cost = pd.DataFrame([dict(pairs=2, cells=len(check), exact_s=120.0, gradient_s=3.0, ratio=40.0)])
    return {"patching": frame, "patching__grid": grid, "patching__steps": steps, "patching__pairs": pairs_table,
            "attribution": frame, "attribution__grid": grid, "attribution__check": check,
            "attribution__agreement": agreement, "attribution__cost": cost, "attribution__pairs": pairs_table,
            "paths": paths, "paths__routes": routes, "paths__pairs": pairs_table}


def all_tables(seed: int = 0) -> dict[str, pd.DataFrame]:
    """Every probe result and part, keyed by file stem."""
    rng = np.random.default_rng(seed)
    dm = depth_matrix(rng)
    ov, cost = overshoot(rng)
    lens, top = logit_lens(rng)
    sp, verdict = splice(rng)
    hd, hsum = heads(rng)
    dr, conc, drift_heads = drift(rng)
    ga, fd = gradient_audit(rng)
    return {"identity": identity(), "logit_lens": lens, "logit_lens__top": top, "depth_matrix": dm,
            "depth_matrix__frontier": frontier_table(dm), "loop_accuracy": loop_accuracy(dm), "overshoot": ov,
            "overshoot__cost": cost, "splice": sp,
            "splice__verdict": verdict, "heads": hd, "heads__summary": hsum, "linear_probe": linear_probe(rng),
            "drift": dr, "drift__concentration": conc, "drift__heads": drift_heads, "halting": halting(),
            "halting__difficulty": halting_difficulty(), "gradient_audit": ga, "gradient_audit__fd": fd,
            "latency": latency(), **loop_dynamics(rng), **patching(rng)}


def summary(tables: dict[str, pd.DataFrame]) -> dict:
    fr = tables["depth_matrix__frontier"]
    return {
        "probes": {"depth_matrix": {"frontier": float(fr.loc[fr["bar"] == 0.71, "frontier"].iloc[0]),
                                    "pooled_accuracy": float(tables["depth_matrix"]["correct"].mean()),
                                    "rows": int(tables["depth_matrix"]["row_id"].nunique())},
                   "identity": {"max_abs_diff": 0.0}},
        "manifests": {"probes/n16.jsonl": {"rows_sha256": "ab" * 32, "row_ids_sha256": "cd" * 32}},
        "checkpoint": {"path": "training/keepers/smollm2-chase", "provenance_sha256": "ef" * 32},
        "model": {"base": "smollm2-135m-instruct", "block": [10, 16]},
        "created_by": "workbench 0.1.0",
    }


def block_selection(n_layers: int = 30) -> dict:
    """A block_selection.json as `workbench select-block` writes it (U-shaped curve, knees near 2 and 26)."""
    curve = [0.5 * np.exp(-i / 1.5) + 0.45 * np.exp((i - n_layers + 2) / 1.5) + 0.08 for i in range(n_layers)]
    windows = [dict(block=[a, a + 6], damage=0.05 + 0.01 * abs(a - 10), loss_loop1=2.0, loss_loop2=2.1,
                    loss_increase=0.1, accuracy_loop1=0.9, accuracy_loop2=0.85, accuracy_drop=0.05, rank=i + 1)
               for i, a in enumerate(range(4, 20, 3))]
    windows.sort(key=lambda w: w["damage"])
    return {"model": "smollm2-135m-instruct", "n_layers": n_layers, "angular_distance": curve, "prelude_end": 3,
            "coda_start": 26, "knees": {"prelude_end": {"layer": 3, "reason": "knee"},
                                        "coda_start": {"layer": 26, "reason": "knee"}},
            "window": 6, "stride": 3, "windows": windows, "recommended": windows[0]["block"], "data": {},
            "weights_sha256": "12" * 32, "corpus_sha256": "34" * 32, "seconds": 12.5}


def write_results(path: Path, tables: dict[str, pd.DataFrame] | None = None, with_summary: bool = True) -> Path:
    """Writes `tables` as DIR/<name>.parquet, a summary.json and a block_selection.json; returns the directory."""
    path.mkdir(parents=True, exist_ok=True)
    tables = all_tables() if tables is None else tables
    for name, df in tables.items():
        df.to_parquet(path / f"{name}.parquet", index=False)
    if with_summary:
        (path / "summary.json").write_text(json.dumps(summary(all_tables())))
        (path / "block_selection.json").write_text(json.dumps(block_selection()))
    return path
