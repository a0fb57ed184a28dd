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
    assert lines[-1].startswith("recommended window 2:8 by untrained damage")


SWEEP = {"budget": "200 steps of r.toml's first stages (primitive 60, two-step 140)",
         "rank_rows": {"per_depth": 128}, "recommended": "12:24",
         "margin": {"separated": True, "why": "the interval excludes 0", "ce_difference": {"value": 0.1, "low": 0.05,
                                                                                          "high": 0.15}},
         "agreement": {"stage1_recommended": "2:8", "stage1_recommended_rank": 2, "windows_in_both": ["2:8"],
                       "spearman_damage_vs_ce": None},
         "table": [{"rank": 1, "window": "12:24", "role": "given", "seeds": 2, "stopped_by_guardrail": False,
                    "heldout_ce": {"value": 0.2, "low": 0.15, "high": 0.25},
                    "acc_d2_loop2": {"value": 0.9, "low": 0.85, "high": 0.95},
                    "runs": [{"guardrail": {"base": 47, "final": 46}}, {"guardrail": {"base": 47, "final": 48}}]},
                   {"rank": 2, "window": "2:8", "role": "span", "seeds": 2, "stopped_by_guardrail": False,
                    "heldout_ce": {"value": 0.3, "low": 0.25, "high": 0.35}, "runs": [{"guardrail": None}]}]}


def test_the_keeper_line_says_its_block_why_and_its_rank():
    (line, no_sweep) = keeper_lines((12, 24), WINDOWS)
    assert "block 12:24" in line and "smollm2_lora_chase.toml" in line and "ranked it 2 of 2 (damage 0.2500)" in line
    assert no_sweep.startswith("no committed window sweep here")
    (line, _) = keeper_lines((12, 24), None)  # --skip-selection: the reason, no rank
    assert "block 12:24" in line and "ranked" not in line
    (line, _) = keeper_lines((10, 16), WINDOWS)
    assert "not among Stage 1's windows" in line


def test_the_keeper_lines_give_the_committed_sweeps_reading_with_its_numbers():
    lines = keeper_lines((12, 24), WINDOWS, ("training/selection/x", SWEEP))
    assert "12:24 ranks 1 of 2 there" in lines[1] and "training/selection/x" in lines[1]
    assert not any(x.startswith("why the keeper keeps") for x in lines)   # the keeper's block won: nothing to check
    assert any("1. 12:24 given" in x and "CE 0.2000 [0.1500, 0.2500]" in x and "46/47, 48/47" in x for x in lines)
    assert any(x.startswith("recommended window 12:24 by 0.1000 nats [0.0500, 0.1500]") and "separated" in x
               for x in lines)
    assert lines[-1].startswith("Stage 1's untrained pick 2:8 ranks 2 here")
    (_, why, *_) = keeper_lines((10, 16), WINDOWS, ("training/selection/x", SWEEP))
    assert "10:16 was not among its candidates" in why


def test_the_keeper_lines_say_how_the_sweeps_winner_did_when_trained_fully():
    """The committed sweep's winner (2:8) trained with the keeper's recipe, from its committed comparison."""
    from workbench.commands.demo import committed_sweep

    sweep = committed_sweep()
    assert sweep is not None and sweep[1]["recommended"] == "2:8"
    lines = keeper_lines((12, 24), WINDOWS, sweep)
    [why] = [x for x in lines if x.startswith("why the keeper keeps 12:24")]
    assert "d3 8/32 vs 32, d4 5/32 vs 32" in why and "smollm2-chase-2-8/versus-keeper" in why
    assert "all 87/224 vs 188" in why and "None" not in why
