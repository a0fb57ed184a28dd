"""Training memory: the peak resident memory one full-block training step adds, measured in a fresh process.

    .venv/bin/python benchmarks/training_memory.py [--hidden 512] [--layers 4] [--steps 3] [--depth 3]

A random llama of `--hidden` width and `--layers` layers (the embedded default's tokenizer, so task rows tokenise
as in a real run) is saved to a temporary directory and trained through the real `Trainer` by a recipe that loops
layers 1..2 with the full-block budget (the block's own weights, the bridge and its gate train, AdamW). Each step
runs in a child process that resets the kernel's peak-RSS counter (`/proc/self/clear_refs`, value 5) just before
the step and reads `VmHWM` after it, so the number is what the step itself added on top of the set-up model:
weights, gradients, AdamW's two moments, activations, and whatever the step copies. Steps 2.. are reported (step
1 also allocates AdamW's state). The child runs with a fixed glibc mmap threshold, so a freed tensor leaves the
resident set at once and the peak follows the live tensors.

The trainer used to clone every trained parameter each step to log how far it moved (`move_rms`): one extra copy
of the trained tensors at the optimizer step. It now measures the movement at the step, one tensor at a time
(`workbench.train.optim.step_with_movement`), so the step's peak is the larger of the backward pass and the update.
Measured on the 2-core Xeon (hidden 512, 4 layers, 32.0 MiB of trained tensors), steps 2..5, peak RSS added:

    loops   clone every tensor (main 3f8d086)   step_with_movement
      3              49.9 MiB                       40.6-41.1 MiB   (the backward pass's activations now set it)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

RECIPE = """
name = "memory"
seed = 0
[model]
base = "{base}"
block = "1:3"
max_loops = 3
[task]
alphabet = 4
[optim]
batch_size = 4
[eval]
every = 1000
per_depth = 1
depths = [1]
[guardrail]
enabled = false
[[stages]]
kind = "chain"
depths = [{depth}]
steps = 10
"""


def _kib(field: str) -> int:
    line = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith(field + ":"))
    return int(line.split()[1])


def child(recipe: str, steps: int) -> dict:
    """In this process: sets a trainer up, then per step the peak RSS it added (MiB) and the trained size."""
    import torch

    from workbench.train.recipe import Recipe
    from workbench.train.trainer import Trainer

    torch.set_num_threads(1)
    trainer = Trainer(Recipe.from_toml(recipe), Path(tempfile.mkdtemp()) / "run", progress=False)
    trainer.setup()
    trainer.build_optimizer("main")
    added = []
    for step in range(steps):
        Path("/proc/self/clear_refs").write_text("5")   # the peak RSS counter starts again from the current RSS
        before = _kib("VmRSS")
        trainer.step(step)
        added.append(round((_kib("VmHWM") - before) / 1024, 1))
    trained = sum(p.numel() * p.element_size() for p in trainer.params)
    return {"peak_added_mib": added, "trained_mib": round(trained / 2 ** 20, 1)}


def save_model(directory: Path, hidden: int, layers: int) -> None:
    """A random llama of this size with the embedded default's tokenizer, as a local HF directory."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from workbench.defaults import EMBEDDED_DEFAULT
    from workbench.models import load_tokenizer

    tok = load_tokenizer(EMBEDDED_DEFAULT)
    config = AutoConfig.for_model("llama", vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden,
                                  num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
                                  tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                                  eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    tok.save_pretrained(directory)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--depth", type=int, default=3, help="every row's depth: the loops each step runs (1..3)")
    p.add_argument("--child", nargs=2, metavar=("RECIPE", "STEPS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]))))
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "model"
        save_model(base, args.hidden, args.layers)
        recipe = Path(tmp) / "recipe.toml"
        recipe.write_text(RECIPE.format(base=base, depth=args.depth))
        # A fixed mmap threshold: every large tensor is its own mapping, returned to the kernel when freed, so
        # the resident size follows the live tensors (glibc's adaptive threshold would keep freed ones resident).
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        done = subprocess.run([sys.executable, __file__, "--child", str(recipe), str(args.steps)],
                              capture_output=True, text=True, check=True, env=env)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    steady = result["peak_added_mib"][1:] or result["peak_added_mib"]
    print(f"full-block step, hidden {args.hidden}, {args.layers} layers, {args.depth} loops: "
          f"trained tensors {result['trained_mib']} MiB; "
          f"peak RSS added per step {result['peak_added_mib']} MiB (steps 2..: max {max(steady)} MiB)")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
