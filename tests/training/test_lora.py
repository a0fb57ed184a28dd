"""The LoRA budget (retrofit paper Sec. 6.2): adapters + bridge train, the base's hash is unchanged."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from workbench.errors import WorkbenchError
from workbench.models import load_base, weights_sha256
from workbench.runs import base_sha256, load_run
from workbench.train.recipe import Recipe
from workbench.train.trainer import Trainer


def test_lora_run_keeps_the_base_hash_and_saves_only_adapters_and_bridge(write_recipe, tmp_path):
    recipe = Recipe.from_toml(write_recipe(lora={"enabled": True, "r": 4, "alpha": 8}, train={"block": False},
                                            optim={"lr": 1e-2}))
    trainer = Trainer(recipe, tmp_path / "lora", progress=False)
    summary = trainer.run()
    run = tmp_path / "lora"
    fresh = weights_sha256(load_base("tiny-llama")[0])
    assert base_sha256(trainer.looped.base) == fresh  # the base's own tensors, bit for bit
    prov = json.loads((run / "provenance.json").read_text())
    assert prov["base_unchanged"] is True and summary["finished"]
    saved = load_file(str(run / "trainable.safetensors"))
    assert {k.split(".")[0] for k in saved} == {"base", "reentry"}
    assert all("lora_" in k for k in saved if k.startswith("base."))
    assert len([k for k in saved if "lora_A" in k]) == 2 * 7  # 2 block layers x 7 projections
    assert any(float(v.abs().sum()) > 0 for k, v in saved.items() if "lora_B" in k)  # B left its zero init
    looped, _, info = load_run(run)
    assert info["retrofit"]["settings"]["lora"]["r"] == 4 and base_sha256(looped.base) == fresh
    # the end-of-run assertion fires if a frozen base was touched
    with torch.no_grad():
        trainer.looped.base.model.layers[2].self_attn.q_proj.base_layer.weight[0, 0] += 1.0
    with pytest.raises(WorkbenchError, match="base weights changed during a frozen-base run"):
        trainer.finish()
