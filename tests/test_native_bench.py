"""benchmarks/native_overhead.py on the tiny native models: it measures what it says (a smoke run)."""

import json

from tests.test_benchmarks import bench  # noqa: F401  (the fixture)


def test_native_overhead_runs_and_records_its_ratios(bench, tmp_path):  # noqa: F811
    rec = bench("native_overhead").main(["--quick", "--reps", "1", "--warmup", "0", "--rows", "2", "--no-progress",
                                         "--out", str(tmp_path)])
    written = json.loads((tmp_path / "native_overhead.json").read_text())
    assert written["results"] == json.loads(json.dumps(rec["results"]))
    for family, r in rec["results"]["families"].items():
        assert r["cached_tensors"] == 4 * r["passes"]
        assert r["max_abs_diff_vs_hf"] == 0.0                       # the adapter's forward is transformers'
        assert all(v["wall"]["median"] > 0 and v["cpu"]["median"] > 0 for v in r["ratios"].values())
        m = r["memory"]
        assert m["lens_read"]["output_bytes"] == 2 * r["passes"] * 1 * 8 * 4   # rows x T x 1 x 8 candidates, fp32
        assert m["hidden_states_full_head"]["output_bytes"] > 1000 * m["lens_read"]["output_bytes"]
        assert m["hidden_states_full_head"]["allocator_peak_bytes"] > m["lens_read"]["allocator_peak_bytes"]
    # HRM's head reads the H stack directly: the transformers route agrees with the lens read at the answer
    assert rec["results"]["families"]["hrm"]["memory"]["answer_scores_max_abs_diff"] < 1e-5
