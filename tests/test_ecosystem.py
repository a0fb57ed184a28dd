"""The ecosystem table of docs/adding-a-looped-architecture.md: every quote is in the installed TransformerLens 4.3
or nnsight 0.8 file it cites, every workbench name in the table exists at every step on the tiny models, and nnsight
traces the workbench's families step by step (`NNsight(looped).loop["t"]...`)."""

import importlib
import importlib.metadata
import re
from pathlib import Path

import pytest
import torch

from tests.test_native import nnsight_reads_and_patches_one_pass
from workbench.models import load_looped

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "adding-a-looped-architecture.md").read_text()
SOURCE = re.compile(r'^- \[([\w-]+)\] `([^`]+)`: "(.+)"$', re.M)
BLOCK = "loop.{t}.block.{i}"
# the tiny families of the table's families -> the names its workbench column spells (the block's sites after
# `loop.{t}.block.{i}.hook_resid_post` abbreviated to their suffix); the Raven family joins with its tiny name
STEPPED = {"tiny-ouro": ("loop.{t}.hook_state", BLOCK + ".hook_resid_post", BLOCK + ".attn.hook_pattern",
                         BLOCK + ".attn.hook_out", BLOCK + ".mlp.hook_out", "loop.{t}.exit.hook_prob"),
           "tiny-raven": ("loop.{t}.hook_state", BLOCK + ".hook_resid_post", BLOCK + ".attn.hook_pattern",
                          BLOCK + ".attn.hook_out", BLOCK + ".mlp.hook_out", "loop.{t}.adapter.hook_in",
                          "loop.{t}.adapter.hook_out")}


def _flat(text: str) -> str:
    return " ".join(text.split())


def _installed(relative: str) -> Path:
    package = relative.split("/")[0]
    return Path(importlib.import_module(package).__file__).parent.parent / relative


def test_the_table_cites_the_installed_versions_and_every_quote_is_there():
    assert importlib.metadata.version("transformer-lens").startswith("4.3.")
    assert importlib.metadata.version("nnsight").startswith("0.8.")
    sources = SOURCE.findall(PAGE)
    cited = set(re.findall(r"\[((?:tl|nnsight)-[\w-]+)\]", PAGE.split("Sources (installed")[0]))
    assert len(sources) >= 9 and cited == {key for key, _, _ in sources}   # every cited key has its quote
    for key, relative, quote in sources:
        assert _flat(quote) in _flat(_installed(relative).read_text()), key


@pytest.mark.parametrize("name", sorted(STEPPED))
def test_every_workbench_name_in_the_table_exists_at_every_step(name):
    looped, _ = load_looped(name)
    column = [row.split(" | ")[-1] for row in PAGE.split("## Side by side with the ecosystem")[1].splitlines()
              if row.startswith("| ")]
    spelled = set(re.findall(r"`([^`]+)`", " ".join(column)))
    for pattern in STEPPED[name]:
        short = pattern if pattern.startswith("loop.{t}.") and BLOCK not in pattern or \
            pattern.endswith("resid_post") else pattern.removeprefix(BLOCK)
        assert short in spelled, short
        for t in range(1, looped.max_loops + 1):
            for i in range(looped.a, looped.b):
                assert pattern.format(t=t, i=i) in looped.hook_dict, (pattern, t, i)


@pytest.mark.parametrize("name", sorted(STEPPED))
@torch.no_grad()
def test_nnsight_traces_each_step_by_name(name):
    looped, tok = load_looped(name)
    nnsight_reads_and_patches_one_pass(looped, tok(["The cat sat on the"], return_tensors="pt")["input_ids"])
