"""What `workbench demo` prints about block selection and the keeper's block, on a planted selection record."""

from workbench.commands.demo import keeper_lines, selection_lines

WINDOWS = [{"block": [2, 8], "damage": 0.0123, "loss_increase": 0.0456, "accuracy_loop1": 0.75, "accuracy_loop2": 0.7,
            "rank": 1},
           {"block": [12, 24], "damage": 0.25, "loss_increase": 0.5, "accuracy_loop1": 0.75, "accuracy_loop2": 0.5,
            "rank": 2}]
SELECTION = {"n_layers": 30, "prelude_end": 2, "coda_start": 26, "window": 6, "recommended": [2, 8],
             "knees": {"prelude_end": {"reason": "knee at 2"}, "coda_start": {"reason": "knee at 26"}},
             "windows": WINDOWS}


def test_the_selection_printout_carries_the_damage_numbers():
    lines = selection_lines(SELECTION)
    assert lines[0].startswith("span 2:26 of 30 layers") and "  prelude_end: knee at 2" in lines
    assert "   2:8  damage 0.0123  (Δloss +0.0456 nats, accuracy 0.750 -> 0.700)" in lines
    assert lines[-1] == "recommended window 2:8"


def test_the_keeper_line_says_its_block_why_and_its_rank():
    (line,) = keeper_lines((12, 24), WINDOWS)
    assert "block 12:24" in line and "smollm2_lora_chase.toml" in line and "ranked it 2 of 2 (damage 0.2500)" in line
    (line,) = keeper_lines((12, 24), None)  # --skip-selection: the reason, no rank
    assert "block 12:24" in line and "ranked" not in line
    (line,) = keeper_lines((10, 16), WINDOWS)
    assert "not among the windows ranked above" in line
