"""The report's title, notes and layout: named for what was probed, provenance folded at the end."""

import json

import synthetic

from workbench.plots.report import write_report


def test_the_title_names_the_checkpoint_and_battery_and_provenance_comes_last(tmp_path):
    results = synthetic.write_results(tmp_path / "probe", synthetic.all_tables())
    record = json.loads((results / "summary.json").read_text())
    record["battery"] = "/somewhere/probes/demo.toml"
    record["probe_runs"] = {"depth_matrix": {"rows": {"per_depth": 8, "chance": 0.125}}}
    (results / "summary.json").write_text(json.dumps(record))
    text = write_report(results).read_text()
    assert "<title>smollm2-chase on the demo battery</title>" in text and "<h1>smollm2-chase on the demo battery</h1>" in text
    assert "chance (guessing among each row&#x27;s symbols): 0.125" in text and "a demo battery" in text
    provenance = text.index("id='what-was-probed'")
    assert text.index("class=\"plotly-graph-div\"") < provenance  # every figure before it
    assert text.index("<details>", provenance) < text.index("id='provenance'", provenance)


def test_an_untrained_control_is_titled_as_one(tmp_path):
    results = synthetic.write_results(tmp_path / "control", synthetic.all_tables())
    record = json.loads((results / "summary.json").read_text())
    record["checkpoint"] = {"path": "untrained:training/keepers/smollm2-chase", "kind": "untrained"}
    record["battery"] = "probes/default.toml"
    (results / "summary.json").write_text(json.dumps(record))
    assert "<h1>untrained control of smollm2-chase on the default battery</h1>" in write_report(results).read_text()
