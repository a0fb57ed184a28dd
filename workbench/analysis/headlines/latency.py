"""The latency probe's headline: seconds per extra loop and what one forced read saves against reruns.

Read from the probe's tables alone (`workbench.probes.latency` writes them), so a results directory is read again
without the model.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.analysis.headlines import Headline, measured


def headline(tables: dict[str, pd.DataFrame]) -> Headline:
    """Seconds per extra loop, and what one forced read saves against reruns, measured and predicted."""
    f = tables["latency"]
    loops = f[f["what"] == "loops"]
    slope = float(np.polyfit(loops["loops"], loops["seconds"], 1)[0]) if len(loops) > 1 else float("nan")
    reruns = f[f["what"] == "reruns"].iloc[0]
    shape = (f"batch {int(f['batch_size'].iloc[0])} × {int(f['seq_len'].iloc[0])} tokens"
             if {"batch_size", "seq_len"} <= set(f.columns) else "one fixed batch")
    numbers = [measured("seconds_per_loop", f"seconds per extra loop ({shape})", round(slope, 4)),
               measured("reruns_over_forced_read", "reruns ÷ one forced read, measured", float(reruns["ratio"]),
                        kind="ratio", expect="≈ the layer-count prediction"),
               measured("reruns_over_forced_read_predicted", "reruns ÷ one forced read, predicted by layer count",
                        float(reruns["predicted_ratio"]), kind="ratio")]
    sentence = (f"Each extra loop costs {slope * 1000:.1f} ms ({shape}); reading every loop in one "
                f"pass is {float(reruns['ratio']):.2f}× cheaper than rerunning to each depth (the layer count predicts "
                f"{float(reruns['predicted_ratio']):.2f}×); wall-clock ratios on a shared machine are noisy.")
    return Headline("latency", numbers, sentence)
