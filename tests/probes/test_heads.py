"""heads finds a planted retrieval head: one head's attention moved onto the line of x_{t-1} at every loop."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.errors import WorkbenchError
from workbench.loop.hooks import hook_name
from workbench.probes import heads
from workbench.tasks.chase import parse_prompt

PLANT_LAYER, PLANT_HEAD = 3, 1


def line_positions(tok, prompt: str, key: str, value: str) -> list[int]:
    """Token positions of the line 'key -> value', found by tokenising the prompt's prefixes."""
    start = prompt.index(f"\n{key} -> {value}\n") + 1
    before = len(tok(prompt[:start])["input_ids"])
    through = len(tok(prompt[:start + len(f"{key} -> {value}")])["input_ids"])
    return list(range(before, through))


class Planter:
    """Hooks that make PLANT_HEAD of PLANT_LAYER attend, from the last token, only to x_{t-1}'s line."""

    def __init__(self, tok):
        self.tok, self.ids = tok, None

    def remember(self, module, args, kwargs):
        self.ids = args[0] if args else kwargs["input_ids"]

    def plant(self, pattern, hook):
        t = int(hook.name.split(".")[1])
        out = pattern.clone()
        for b, ids in enumerate(self.ids):
            prompt = self.tok.decode(ids, skip_special_tokens=True)
            _, inst = parse_prompt(prompt)
            key = inst.iterate(t - 1)
            pos = line_positions(self.tok, prompt, key, inst.table[key])
            out[b, PLANT_HEAD, -1] = 0
            out[b, PLANT_HEAD, -1, pos] = 1.0 / len(pos)
        return out


@pytest.fixture(scope="module")
def planted(tiny_looped, rows):
    looped, tok = tiny_looped
    subset = [r for r in rows if r["depth"] >= 2][::2]
    planter = Planter(tok)
    handle = looped.register_forward_pre_hook(planter.remember, with_kwargs=True)
    names = [(hook_name("pattern", t, PLANT_LAYER), planter.plant) for t in range(1, 5)]
    try:
        with looped.hooks(fwd_hooks=names):
            tables = heads.run(looped, tok, subset, n_null=100)
    finally:
        handle.remove()
    return tables, subset


def test_the_planted_head_is_the_retrieval_head_at_every_loop(planted):
    tables, subset = planted
    s = tables["heads__summary"]
    found = s[s["is_retrieval"]]
    assert set(zip(found["layer"], found["head"])) == {(PLANT_LAYER, PLANT_HEAD)}
    assert sorted(found["loop"]) == [1, 2, 3, 4]
    assert (found["retrieval_frac"] == 1.0).all()
    top = s.loc[s.groupby("loop")["share"].idxmax()]
    assert (top["layer"] == PLANT_LAYER).all() and (top["head"] == PLANT_HEAD).all()
    assert (s["concentration"] > s["null_p95"]).all()


def test_the_planted_head_puts_all_its_mass_on_the_target_line(planted):
    tables, subset = planted
    f = tables["heads"]
    mine = f[(f["layer"] == PLANT_LAYER) & (f["head"] == PLANT_HEAD)]
    assert np.allclose(mine["target_mass"], 1.0) and np.allclose(mine["table_mass"], 1.0)
    assert len(mine) == sum(r["depth"] for r in subset)  # active loops only
    others = f[(f["layer"] != PLANT_LAYER) | (f["head"] != PLANT_HEAD)]
    assert others["target_mass"].max() < 0.5 and (others["table_mass"] >= others["target_mass"]).all()


def test_without_a_plant_no_head_stands_out(tiny_looped, rows):
    looped, tok = tiny_looped
    tables = heads.run(looped, tok, [r for r in rows if r["depth"] >= 2][::4], n_null=50)
    assert not tables["heads__summary"]["is_retrieval"].any()


def test_concentration_and_its_null():
    assert heads.concentration(np.array([0.5, 0.3, 0.2])) == pytest.approx(0.34)
    masses = np.tile(np.array([1.0, 0, 0, 0]), (50, 1))
    null = heads.shift_null(masses, 200, np.random.default_rng(0))
    assert heads.concentration(masses.sum(0) / masses.sum()) == 1.0 and np.percentile(null, 95) < 0.5


def test_heads_refuses_layers_outside_the_block(tiny_looped, rows):
    looped, tok = tiny_looped
    with pytest.raises(WorkbenchError, match="not a block layer"):
        heads.run(looped, tok, rows[:2], layers=[0])
