"""The loop-accuracy probe's headline: the final answer at every loop count and the best loop.

Read from the probe's tables alone (`workbench.probes.loop_accuracy` writes them), so a results directory is read
again without the model.
"""

from __future__ import annotations

import pandas as pd

from workbench.analysis.headlines import Headline, depth_ranges, proportion


def headline(tables: dict[str, pd.DataFrame]) -> Headline:
    """Accuracy at every loop count (Wilson over rows, paired by row id across runs) and the best loop."""
    frame = tables["loop_accuracy"]
    numbers = [proportion(f"loop_{int(t)}", f"final answer at {int(t)} loop{'s' if t > 1 else ''}",
                          g.set_index("row_id")["correct"]) for t, g in frame.groupby("loop")]
    best = max(numbers, key=lambda n: (n.value, -int(n.key.removeprefix("loop_"))))
    first = numbers[0]
    n_rows = int(frame["row_id"].nunique())
    where = f"d = {depth_ranges(frame['depth'].unique())}, n = {n_rows} rows"
    if best is first:
        sentence = f"The final answer reads best at 1 loop ({first.text()}; {where}); more loops do not help."
    else:
        sentence = (f"The final answer reads {first.text()} at 1 loop and {best.text()} at "
                    f"{best.key.removeprefix('loop_')} loops, the best of 1..{len(numbers)} ({where}).")
    return Headline("loop_accuracy", numbers, sentence)
