"""Chance and the demo warning under a battery's headlines, on planted rows and summaries."""

from workbench.analysis.readings import battery_notes, chance


def rows(n_symbols: int, k: int = 3) -> list[dict]:
    symbols = [chr(65 + i) for i in range(n_symbols)]
    return [{"symbols": symbols, "answer": "A"} for _ in range(k)]


def test_chance_is_one_over_the_symbols_and_none_for_multi_token_answers():
    assert chance(rows(8)) == 0.125
    assert chance(rows(8) + rows(4)) == (3 * 0.125 + 3 * 0.25) / 6
    assert chance([{"symbols": ["A"], "answer": "v1 v2"}]) is None and chance([]) is None


def test_a_demo_battery_says_so_and_gives_chance():
    summary = {"battery": "/x/probes/demo.toml",
               "probe_runs": {"depth_matrix": {"rows": {"per_depth": 8, "chance": 0.125}},
                              "linear_probe": {"rows": {"chance": 0.125}}}}
    chance_line, demo_line = battery_notes(summary)
    assert chance_line.startswith("chance (guessing among each row's symbols): 0.125;")
    assert "a demo battery: as few as 8 rows per depth (depth_matrix)" in demo_line and "not numbers to cite" in demo_line


def test_the_default_battery_gets_chance_only():
    summary = {"battery": "probes/default.toml", "probe_runs": {"depth_matrix": {"rows": {"per_depth": 32,
                                                                                          "chance": 0.125}}}}
    assert battery_notes(summary) == ["chance (guessing among each row's symbols): 0.125; every accuracy above "
                                      "reads against it"]


def test_a_full_battery_with_a_small_probe_says_few_rows_not_demo():
    summary = {"battery": "probes/default.toml",
               "probe_runs": {"depth_matrix": {"rows": {"per_depth": 32, "chance": 0.125}},
                              "gradient_audit": {"rows": {"per_depth": 2, "chance": 0.125}}}}
    few = battery_notes(summary)[1]
    assert few.startswith("few rows: as few as 2 rows per depth (gradient_audit);") and "demo" not in few


def test_rows_without_a_depth_are_counted_whole_not_by_the_batterys_per_depth():
    """A user's 40 rows read under a battery entry with per_depth = 12: all 40 were read, enough; 8 would be few."""
    def summary(n):
        return {"battery": "probes/default.toml",
                "probe_runs": {"logit_lens": {"rows": {"n": n, "per_depth": 12, "depth_not_given": n}}}}
    assert battery_notes(summary(40)) == []
    assert battery_notes(summary(8)) == ["few rows: as few as 8 rows per depth (logit_lens); their intervals are "
                                         "wide, and a difference inside them is not a finding"]
