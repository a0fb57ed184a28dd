"""The paths probe's headline: per corruption and source loop, the share the loops and the readout route recover.

Read from the probe's tables alone (`workbench.probes.paths` writes them), so a results directory is read again
without the model.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.analysis.headlines import Headline, Number

BAR = 0.5


def reading(routes: pd.DataFrame) -> dict[tuple[str, int], str]:
    """{(corruption, source t): "iterated" | "read at the end" | "neither"} at the last loop each t is read at."""
    out = {}
    for (corruption, t), g in routes.groupby(["corruption", "source"]):
        last = g[g["read"] == g["read"].max()].set_index("route")["recovered"]
        via, direct = last.get("loops", np.nan), last.get("readout", np.nan)
        if np.isfinite(direct) and direct >= BAR:
            out[(corruption, int(t))] = "read at the end"
        elif np.isfinite(via) and via >= BAR:
            out[(corruption, int(t))] = "iterated"
        else:
            out[(corruption, int(t))] = "neither"
    return out


def headline(tables: dict[str, pd.DataFrame]) -> Headline:
    """Per corruption and source loop t: the loops and readout routes' recovered share at the last loop read."""
    routes = tables["paths__routes"]
    numbers, parts = [], []
    verdicts = reading(routes)
    for (corruption, t), verdict in sorted(verdicts.items()):
        g = routes[(routes["corruption"] == corruption) & (routes["source"] == t)]
        u = int(g["read"].max())
        for route in ("loops", "readout"):
            r = g[(g["route"] == route) & (g["read"] == u)]
            if len(r):
                r = r.iloc[0]
                numbers.append(Number(f"{route}_{corruption}_t{t}_u{u}", f"{corruption} edit: clean h_{t} via "
                                      f"{'the later loops' if route == 'loops' else 'the readout only'}, read at loop {u}",
                                      float(r.recovered), int(r.n), float(r.low), float(r.high), "row bootstrap",
                                      "proportion"))
        parts.append(f"{corruption} edit, h_{t}: {verdict}")
    sentence = ("The state leaving loop t, read at the last loop: " + "; ".join(parts)) if parts else \
        "No pair had a later loop whose two chains differ"
    return Headline("paths", numbers, sentence + f" ({len(tables['paths__pairs'])} pairs).")
