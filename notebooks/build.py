"""Writes the numbered notebooks from the cells below, without outputs: `python notebooks/build.py`.

Edit the cells here, not in Jupyter, then regenerate; `tests/test_notebooks.py` checks that the
committed notebooks match this file and runs each one top to bottom. Every notebook imports
only the library (plus torch, pandas and plotly) and keeps to a few rows, so each runs in
about a minute or two on two CPU cores.

The notebooks are committed with the metadata JupyterLab itself writes when it starts the
project's kernel (`kernel_metadata`), so opening one in JupyterLab does not mark it modified.
Figures drawn in them carry offline HTML and a PNG beside the Plotly mime type
(`workbench.plots.notebook`), so executed notebooks survive `jupyter nbconvert --to html`;
`offline.html.j2` here is nbconvert's page without its CDN scripts (require.js, MathJax):

    jupyter nbconvert --to html --template-file notebooks/offline.html.j2 notebooks/01_logit_lens.ipynb
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

# Every notebook starts here: find the repository root from wherever Jupyter was started.
ROOT = '''from pathlib import Path

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "pyproject.toml").is_file())
KEEPER = ROOT / "training" / "keepers" / "smollm2-chase"   # the shipped retrofit of the embedded default
MANIFEST = ROOT / "probes" / "chase_n8_d1-7.jsonl"          # frozen N = 8 chase rows, depths 1-7'''

KEEPER_AND_ROWS = '''from workbench.probes.common import select_rows
from workbench.runs import load_run
from workbench.tasks.manifest import read_manifest

looped, tok, info = load_run(KEEPER)        # strict: every file's hash and the base's hash are checked
manifest = read_manifest(MANIFEST)
config = looped.retrofit_config             # the architecture, as retrofit.json records it
print(f"{KEEPER.name}: block {looped.a}:{looped.b} of {looped.n_layers} layers, re-entry {config.reentry}, "
      f"max {config.max_loops} loops, LoRA {config.lora is not None}")
print(f"rows: {MANIFEST.name}, {manifest.sidecar['rows']} rows, rows_sha256 {manifest.sidecar['rows_sha256'][:16]}...")'''


def md(text: str):
    return new_markdown_cell(text.strip())


def code(text: str):
    return new_code_cell(text.strip())


LOGIT_LENS = [
    md("""
# 01 · The per-loop logit lens

A looped retrofit runs the same block `T` times and can read an answer after every loop. On the
function-table chase the loop-`t` readout should hold the chain symbol `x_t` (the start symbol
with the table applied `t` times): the loop is doing one lookup per pass. This notebook reads
every loop of the shipped keeper in one forward pass and shows, loop by loop, which chain
symbol the readout holds, through three lenses:

* **coda**: the model's own readout (the Coda layers, final norm, unembedding), what it was trained to emit;
* **raw**: final norm and unembedding applied directly to the loop state `h_t`, skipping the Coda;
* **tuned**: a per-loop affine map fitted to predict the final loop's readout, on rows disjoint from the ones shown.
"""),
    code(ROOT),
    code(KEEPER_AND_ROWS),
    md("A row is a table of `K -> V` lines, a start symbol and a number of applications; the answer is one token."),
    code('''rows = select_rows(manifest.rows, depths=[2, 3, 4], per_depth=4)
print(rows[-1]["prompt"])
print("chain:", rows[-1]["start"], "->", " -> ".join(rows[-1]["chain"]))'''),
    md("""
## Every loop, one pass

`read_rows` runs the loop once to `T` and reads every loop through the Coda at the answer
position, scoring only the task's candidate symbols. One row per (row, loop).
"""),
    code('''from workbench.tasks.reader import read_rows

reads = read_rows(looped, tok, rows, loops=4).frame()
active = reads[reads["loop"] <= reads["depth"]]
active.groupby(["depth", "loop"])["correct"].mean().unstack("loop").round(2)'''),
    md("## The lens, loop by loop"),
    code('''from workbench.probes import logit_lens

tables = logit_lens.run(looped, tok, rows, loops=4)
lens, top = tables["logit_lens"], tables["logit_lens__top"]
lens.head()'''),
    md("""
Each cell is the mean probability (over the task's candidates) of chain symbol `x_k` at loop `t`.
A loop that does one lookup per pass lights up the diagonal `k = t`. Hover a cell for the loop's
top tokens over the whole vocabulary; the slider steps through the depths.
"""),
    code('''from workbench.plots import lens_agreement_figure, logit_lens_figure

logit_lens_figure(lens, top=top)'''),
    code('''logit_lens_figure(lens, top=top, lens="raw")'''),
    md("Per lens: the probability of the loop's own target `x_t` (solid) and of the next symbol `x_{t+1}` (dotted)."),
    code('''lens_agreement_figure(lens)'''),
    md("One row, with its symbols on the axis:"),
    code('''row = lens[lens["depth"] == 4]["row_id"].iloc[0]
logit_lens_figure(lens, top=top, row_id=row)'''),
    md("""
## The same states through hooks

Every loop has its own hook points (docs/hooks.md), so `run_with_cache` returns each loop's
state under its own name, and the raw lens above is just the final norm and unembedding
applied to `loop.{t}.hook_state` at the answer position. Names come from
`workbench.loop.hooks.hook_name(site, loop, layer)`, and `stack_loops` stacks one site over
loops into a `[T, ...]` tensor.
"""),
    code('''import torch

from workbench.loop.hooks import hook_name, loop_hook_names, stack_loops
from workbench.tasks.reader import encode_prompts

enc = encode_prompts(tok, [rows[-1]["prompt"]])
with torch.no_grad():
    _, cache = looped.run_with_cache(enc["input_ids"], attention_mask=enc["attention_mask"], loops=4,
                                     names_filter=loop_hook_names("state", 4))
    states = stack_loops(cache, "state", 4)                  # [T, batch, seq, d_model]
    for t, h in enumerate(states, start=1):
        logits = looped.base.lm_head(looped.base.model.norm(h[:, -1]))
        print(f"{hook_name('state', t):18s} {tuple(h.shape)}  raw-lens top token {tok.decode(logits.argmax(-1))!r}")'''),
]

BLOCK_SELECTION = [
    md("""
# 02 · Choosing the block before surgery

Which layers should loop? The retrofit paper cuts the model where adjacent layers change the
residual stream least: the angular distance between consecutive layers' states is large at
both ends of the network and small through the middle. Kneedle finds the two knees; the span
between them is loopable. Inside the span, each candidate window is applied twice (loop 2
with a fresh, identity re-entry) and ranked by the damage it does: the relative rise in
held-out next-token loss plus the task accuracy lost.

This runs on the embedded default, SmolLM2-135M-Instruct (a 4-bit GGUF dequantized to fp32),
with a small corpus slice and a coarse stride so it stays short; `workbench select-block`
runs the full sweep.
"""),
    code(ROOT),
    code('''from workbench.models import load_base
from workbench.selection.stage1 import load_corpus, select_block, task_rows

base, tok = load_base("smollm2-135m-instruct")
texts = load_corpus()[:16]                    # every 4th text is held out for the loss
rows = task_rows(tok)[:8]                     # the accuracy part of the damage
selection = select_block(base, tok, texts=texts, rows=rows, stride=10, progress=False)
print(f"span {selection.prelude_end}:{selection.coda_start} of {selection.n_layers} layers; "
      f"window {selection.window}; recommended {selection.recommended}")'''),
    code('''from workbench.plots.selection import angular_distance_figure, windows_frame

record = selection.to_dict()                  # what block_selection.json holds
angular_distance_figure(record)'''),
    code('''windows_frame(record)'''),
    md("""
## Surgery, and the identity check

`retrofit` splits the model at the chosen block. With a fresh split bridge the re-entry is an
exact identity, so at loop 1 the retrofit must reproduce the base model bit for bit, whatever
the settings. Everything that decides the architecture is one `RetrofitConfig`; a run directory
stores exactly its `to_dict()` and rebuilds the model from it.
"""),
    code('''from workbench.loop.config import RetrofitConfig
from workbench.loop.surgery import retrofit

looped = retrofit(base, RetrofitConfig(block=selection.recommended, reentry="bridge", max_loops=4))
looped.retrofit_config'''),
    code('''import torch

enc = tok(["The capital of France is"], return_tensors="pt")
with torch.no_grad():
    base_logits = base(**enc).logits
    loop1 = looped(enc["input_ids"], attention_mask=enc["attention_mask"], loops=1).logits
print("max |Δlogit| at loop 1:", (base_logits - loop1).abs().max().item())'''),
    md("""
The shipped keeper (`training/keepers/smollm2-chase`) loops 12:24 rather than the window
ranked first here: its recipe explains why (a longer block gave loop 2 more layers to turn
one lookup's answer into the next lookup's query).
"""),
    code('''import tomllib

print(tomllib.loads((KEEPER / "recipe.toml").read_text())["model"])'''),
]

SPLICE_OVERSHOOT = [
    md("""
# 03 · Splices and overshoot

Two questions about what the loop state carries, on the shipped keeper:

* **Overshoot**: run a depth-`d` row past `d`. Does the readout keep applying the rule
  (*iterate*: `f^t(x0)`), hold the answer (*park*: `x_d`), or neither?
* **Counterfactual splice**: take row B's state at loop `k0` and put it into row A in place of
  A's own (A's Prelude is still re-injected). Does A then follow B's chain (*source orbit*),
  apply its own table to B's symbol (*lawful*), ignore the splice (*shortcut*), or none?
"""),
    code(ROOT),
    code(KEEPER_AND_ROWS),
    md("## Overshoot"),
    code('''from workbench.plots import overshoot_cost_figure, overshoot_figure
from workbench.probes import overshoot

rows = select_rows(manifest.rows, depths=[1, 2, 3], per_depth=4)
tables = overshoot.run(looped, tok, rows, extra=3)
overshoot_figure(tables["overshoot"])'''),
    code('''overshoot_cost_figure(tables["overshoot"], tables["overshoot__cost"])'''),
    md("The probe's headline: the numbers `workbench probe` prints and the report shows, with n and 95% intervals."),
    code('''overshoot.headline(tables)'''),
    md("""
## Counterfactual splice

Rows are paired within a depth and a token length, so the substitution is shape-safe. Sites:
the loop state `h_k0`, one block layer's residual, and the re-entry input `u_k0`, each at the
read position only; the state also at every position. Entries where two class symbols
coincide are left out.
"""),
    code('''from workbench.plots import splice_figure
from workbench.probes import splice

pairs_rows = select_rows(manifest.rows, depths=[4], per_depth=6)
# One splice loop keeps this short; the battery runs k0 = 1 and 2.
spliced = splice.run(looped, tok, pairs_rows, k0s=(2,), horizon=2)
splice_figure(spliced["splice"], verdict=spliced["splice__verdict"])'''),
    code('''spliced["splice__verdict"]'''),
    code('''splice.headline(spliced)'''),
    md("""
## Where the answer is made: patching, its gradient estimate, and paths

The splice moves a whole state. Activation patching asks where, inside the loops, the answer depends on one
fact: each depth-4 row gets a twin with one table entry on its chain changed (the line loop `k` reads: the
*step*), and the clean run's activation at one (loop, block layer, position class, component) is written into
the twin. Each cell shows the share of the clean answer's logit margin it restores. Here two layers (the block's
middle and last) and two position classes keep it short (`probes/patching.toml` runs every layer and class: about
80 s a pair on two cores).
"""),
    code('''from workbench.plots import attribution_figure, patching_figure, patching_steps_figure, paths_figure
from workbench.probes import attribution, patching, paths

edit_rows = select_rows(manifest.rows, depths=[4], per_depth=4)          # steps 1, 2, 3, 4: one row each
small = dict(corruptions=("entry",), positions=("edited", "read"), layers=[18, 23])
grid = patching.run(looped, tok, edit_rows, **small)
patching_figure(grid["patching"], grid=grid["patching__grid"])'''),
    md("""
If each loop takes one lookup, an edit to the entry loop `k` reads reaches the read position's state at loop `k`,
not before: one line per step.
"""),
    code('''patching_steps_figure(grid["patching"], steps=grid["patching__steps"])'''),
    md("""
The gradient estimate (attribution patching) of the same cells costs one forward and one backward a pair; the
probe runs the exact grid on `check_pairs` of them and says, by a fixed rule, whether the cheap map can be trusted.
"""),
    code('''cheap = attribution.run(looped, tok, edit_rows, check_pairs=1, **small)
print(attribution.headline(cheap).sentence)
attribution_figure(cheap["attribution"], check=cheap["attribution__check"])'''),
    md("""
Paths: the clean state leaving loop `t`, sent through the later loops, or straight into a later loop's readout.
A loop that iterates needs the later loops (the readout of `h_t` reads `x_t`, not the answer).
"""),
    code('''routes = paths.run(looped, tok, edit_rows[2:], corruptions=("entry",))   # steps 3 and 4
print(paths.headline(routes).sentence)
paths_figure(routes["paths"], routes=routes["paths__routes"])'''),
]

HEADS_DRIFT = [
    md("""
# 04 · Heads and drift

Where inside the block does the lookup happen, and how far do the loop states move?

* **Heads**: with eager attention, the attention mass from the answer position onto the table
  line that holds the current symbol `x_{t-1}` (the line loop `t` must read), for every loop,
  block layer and head. A head is a *retrieval head* at a loop when its mass is at least 3x its
  layer's median on at least half the rows.
* **Drift**: principal angles between the loop states' top-k PCA subspaces, loop to loop and
  against loop 1, and whether the drift outside loop 1's subspace concentrates in a few
  heads' output subspaces (against random partitions).
"""),
    code(ROOT),
    code(KEEPER_AND_ROWS),
    md("## Head specialisation"),
    code('''from workbench.plots import head_concentration_figure, heads_figure
from workbench.probes import heads

rows = select_rows(manifest.rows, depths=[3], per_depth=8)
h = heads.run(looped, tok, rows, n_null=50)
heads_figure(h["heads"], summary=h["heads__summary"])'''),
    code('''head_concentration_figure(h["heads"], h["heads__summary"])'''),
    code('''summary = h["heads__summary"]
summary[summary["is_retrieval"]].sort_values(["loop", "retrieval_frac"], ascending=[True, False])'''),
    md("The headline, as `workbench probe` prints it and the report shows it:"),
    code('''heads.headline(h)'''),
    md("## Subspace drift"),
    code('''from workbench.plots import drift_figure, drift_heads_figure
from workbench.probes import drift

rows = select_rows(manifest.rows, depths=[1, 2, 3, 4], per_depth=3)
d = drift.run(looped, tok, rows, loops=4, k=8, max_samples=1024, n_null=50)
drift_figure(d["drift"], concentration=d["drift__concentration"])'''),
    code('''drift_heads_figure(d["drift"], d["drift__heads"])'''),
    code('''drift.headline(d)'''),
]

TRAINING = [
    md("""
# 05 · Training a small retrofit

`workbench train RECIPE.toml` turns the embedded default into a looped retrofit: surgery at the
recipe's block, LoRA on the block projections with the split bridge, per-loop supervision on
the chase, and a depth curriculum. This notebook runs the shipped recipe for a handful of
steps, one per curriculum stage (via `--set`-style overrides) to show the mechanics and the files a run writes, then
compares its held-out accuracy with the shipped keeper, trained with the full recipe.

One override turns the capability guardrail off: it scores 64 few-shot arithmetic rows at loop 1 before
training and at every evaluation, and those two readings would cost more than the three steps. A real run
keeps it; the keeper's readings are in its `provenance.json`, printed at the end.
"""),
    code(ROOT),
    code('''print((ROOT / "training" / "smollm2_lora_chase.toml").read_text())'''),
    code('''import tempfile

from workbench.train.trainer import train

run_dir = Path(tempfile.mkdtemp(prefix="workbench-nb05-")) / "tiny-run"
overrides = {"stages.0.steps": 1, "stages.1.steps": 1, "stages.2.steps": 1, "optim.warmup_steps": 1,
             "eval.per_depth": 4, "eval.depths": [1, 2], "checkpoint.every": 1000, "guardrail.enabled": False}
result = train(ROOT / "training" / "smollm2_lora_chase.toml", out=run_dir, overrides=overrides, progress=False)
{k: result[k] for k in ("run_dir", "steps", "finished", "wall_s")}'''),
    md("The run directory holds only the trained tensors, the resolved recipe and the provenance of every file:"),
    code('''sorted(p.name for p in run_dir.iterdir())'''),
    code('''import pandas as pd
import plotly.graph_objects as go

from workbench.plots import apply_theme

metrics = pd.read_json(run_dir / "metrics.jsonl", lines=True)
loss = metrics.dropna(subset=["loss"]) if "loss" in metrics else metrics
fig = go.Figure(go.Scatter(x=loss["step"], y=loss["loss"], mode="lines+markers", name="training loss"))
fig.update_layout(title="Training loss per step", xaxis_title="step", yaxis_title="loss", height=350)
fig.update_xaxes(tick0=1, dtick=max(1, len(loss) // 10))
apply_theme(fig)'''),
    md("""
## Held-out accuracy: three steps against the keeper

Both are read with the same reader on the same held-out rows; each depth is read at its own
loops. The keeper is the same recipe run to the end.
"""),
    code('''from workbench.plots import depth_matrix_figure
from workbench.runs import load_run
from workbench.tasks import build_rows
from workbench.train.evaluate import evaluate

small, tok, _ = load_run(run_dir)
held_out = build_rows("chase", depths=[1, 2, 3], per_depth=6, seed=7, alphabet=8, tokenizer=tok)
_, small_frame = evaluate(small, tok, held_out)
depth_matrix_figure(small_frame).update_layout(title="After three steps")'''),
    code('''keeper, tok, info = load_run(KEEPER)
_, keeper_frame = evaluate(keeper, tok, held_out)
depth_matrix_figure(keeper_frame).update_layout(title=f"The keeper ({KEEPER.name})")'''),
    md("The guardrail this notebook's run skipped, as the keeper's full run read it (correct of 64, at loop 1):"),
    code('''guard = info["provenance"]["guardrail"]      # the keeper's provenance.json, as load_run read it
print(f"the keeper's guardrail: base {guard['base']}/{guard['total']}, final {guard['final']}/{guard['total']} "
      f"(a run stops {guard['max_drop']} points below the base); read at steps {[step for step, _ in guard['readings']]}")'''),
]

NATIVE = [
    md("""
# 06 · Native looped models: every pass of a model the workbench did not build

transformers ships two looped architectures: **Inkling2Loop** (decoder layers
`[loop_layer_index_start, loop_layer_index_end)` run `loop_num_passes` times; every pass after the
first restarts from the pre-loop state and reads gated "messages" from the pass before) and
**HRM-Text** (a slow H stack and a fast L stack; one H cycle runs `L_cycles` L stacks, then the H
stack). `workbench.models.load_looped` gives either the workbench's looped interface: a hook point
per site *and per pass*, `read` decoding every pass through the model's own readout, and the probe
battery. With no hook attached the logits equal transformers' own forward bit for bit
(tests/test_native.py).

**The models here have random weights.** No real checkpoint can be downloaded on this machine, so
every number below describes tiny random models (4 layers or 2 per stack, hidden 64): the notebook
shows what runs and what comes out, not what a trained model computes.
"""),
    code(ROOT),
    code('''from workbench.models import load_looped

ink, tok = load_looped("tiny-inkling2-loop")   # random weights: 4 layers, layers 1-2 looped 3 times
hrm, _ = load_looped("tiny-hrm-text")           # random weights: 2 layers per stack, 2 H cycles of 2 L cycles
for m in (ink, hrm):
    print(f"{m.family} (random weights): looped layers {m.a}:{m.b} of {m.n_layers}, native passes "
          f"{m.native_loops}, readable passes 1..{m.max_loops}, {len(m.hook_dict)} hook points")'''),
    md("""
## One name per pass

Every pass has its own names (`workbench.loop.hooks.hook_name`), so `run_with_cache` keeps each pass
apart. Besides the sites every looped model has (`loop.{t}.hook_state`, `block.{layer}.hook_resid_post`,
attention patterns), Inkling has its messages, its forget and message gates and the pass-query
attention over the previous pass; HRM has the L cycles inside each H cycle (docs/hooks.md).
"""),
    code('''import torch

from workbench.loop.hooks import hook_name, loop_hook_names, stack_loops
from workbench.tasks.reader import encode_prompts

enc = encode_prompts(tok, ["A -> C\\nB -> A\\nC -> B\\nStart at A. Apply the table 2 times.\\nAnswer:"])
ids, mask = enc["input_ids"], enc["attention_mask"]
names = loop_hook_names("state", 6) + [hook_name("message", 2, 1), hook_name("forget_gate", 2, 1, gate="q"),
                                       hook_name("message_pattern", 3, 2)]
with torch.no_grad():
    _, cache = ink.run_with_cache(ids, attention_mask=mask, loops=6, names_filter=names)
for name in names:
    print(f"{name:38s} {tuple(cache[name].shape)}")
states = stack_loops(cache, "state", 6)[:, 0, -1]             # [pass, d_model] at the answer position
print("distance of each pass's state from pass 3 (the native count):",
      ", ".join(f"{float((s - states[2]).norm()):.3g}" for s in states))'''),
    md("""
Reading pass `t` decodes (h_t, its block states) through the post-loop layers, `final_input`, norm,
head and softcap: exactly what transformers' model returns when `loop_num_passes = t`. Passes 4-6 are
past the trained count: the message step applied again (docs/analyses.md).
"""),
    code('''with torch.no_grad():
    r = ink.read(ids, attention_mask=mask, loops=6)
    top = r.scores[0, :, 0].topk(3, dim=-1)
for t in range(6):
    tokens = ", ".join(repr(tok.decode(int(i))) for i in top.indices[t])
    print(f"pass {t + 1}{' (native)' if t + 1 == ink.native_loops else ''}: top tokens {tokens}")

with torch.no_grad():
    _, low = hrm.run_with_cache(ids, attention_mask=mask, loops=2,
                                names_filter=[hook_name("low_state", t, cycle=c) for t in (1, 2) for c in (1, 2)])
print("HRM L cycles cached:", sorted(low.keys()))'''),
    md("""
## The battery, unchanged

`workbench probe --checkpoint DIR` (or `run_battery`) runs every probe that applies on a native
model, with `probes/native.toml` as its default battery; probes that need a retrofit say why they
do not apply. Here a few probes on the tiny Inkling model, written to a temporary directory.
"""),
    code('''import tempfile

import pandas as pd

from workbench.probes.battery import run_battery

out = Path(tempfile.mkdtemp()) / "tiny-inkling2-loop"
summary = run_battery("tiny-inkling2-loop", None, out, progress=False,
                      only=["identity", "depth_matrix", "logit_lens", "heads", "gradient_audit", "latency"])
for name, result in summary["probes"].items():
    print(f"{name:15s}", "not applicable: " + result["reason"] if "reason" in result else "ran")'''),
    code('''from workbench.plots import depth_matrix_figure, heads_figure, logit_lens_figure

depth_matrix_figure(pd.read_parquet(out / "depth_matrix.parquet")).update_layout(
    title="Inkling2Loop, random weights: chase accuracy by depth and pass")'''),
    code('''lens, top = pd.read_parquet(out / "logit_lens.parquet"), pd.read_parquet(out / "logit_lens__top.parquet")
logit_lens_figure(lens, top=top)'''),
    code('''heads_figure(pd.read_parquet(out / "heads.parquet"), summary=pd.read_parquet(out / "heads__summary.parquet"))'''),
    md("""
## On a real checkpoint

With Inkling-2-Mini or an HRM-Text checkpoint on disk, the same calls read the trained model:
`load_looped("path/to/Inkling-2-Mini", dtype=torch.bfloat16)` and `workbench probe --checkpoint
path/to/dir`. There the depth matrix and logit lens would show whether later passes carry the chase
one lookup further (the signature of a loop that iterates) or settle on the pass-1 answer, and the
gates would show how much of each pass is its own and how much the message from the pass before.
The weights alone need the memory below (transformers' config defaults, which it documents as
the released checkpoints'; counted on the meta device, nothing allocated); activations and the
per-pass reads come on top.
"""),
    code('''from workbench.models.native import default_size

pd.DataFrame([default_size("inkling2_loop_text"), default_size("hrm_text")])'''),
    md("""
## Ouro: a family the workbench writes itself, and its learned exit

No package ships Ouro's modeling code (it sits beside the weights as remote code, never run here), so the
workbench writes the family itself (`workbench/models/native/ouro.py`): the whole layer stack is one step,
run 4 times, with the final norm and a learned **exit gate** after every step. Its logits at every step equal
the reference modeling code's committed outputs (tests/test_native_ouro.py). The gate's probability
lambda_t is a hook per step (`loop.{t}.exit.hook_prob`); a token exits at the first step whose cumulative exit
probability reaches the config's threshold, which is `looped(ids)` with no step count. Random weights again.
"""),
    code('''from workbench.models.native.ouro import GateExit

ouro, ouro_tok = load_looped("tiny-ouro")   # random weights: 2 layers, the stack looped 4 times
enc = encode_prompts(ouro_tok, ["A -> C\\nB -> A\\nC -> B\\nStart at A. Apply the table 2 times.\\nAnswer:"])
with torch.no_grad():
    lam = ouro.exit_probabilities(enc["input_ids"], enc["attention_mask"])[0, :, -1]   # [step] at the last token
    cdf = ouro.exit_distribution(lam[None, :, None])[0, :, 0].cumsum(0)
    adaptive = ouro.adaptive_read(enc["input_ids"], enc["attention_mask"], policy=GateExit())
for t in range(4):
    print(f"step {t + 1}: exit probability {float(lam[t]):.3f}, cumulative {float(cdf[t]):.3f}")
print(f"threshold {ouro.exit_threshold}: the last token exits at step {int(adaptive.loops_used[0])}")'''),
    md("""
## Raven (Huginn-0125's format): a random initial state, its norm per step, and a zero-shot exit

The workbench writes Raven too (`workbench/models/native/raven.py`): two Prelude layers embed the prompt, a
recurrent core starts from a random state s_0 and re-injects the Prelude's output through an adapter at every
step, and a Coda reads s_t; every step equals the reference code's committed outputs
(tests/test_native_raven.py). s_0 is drawn from `init_seed` (or given as `init_state=`), so two reads of a prompt
agree. Below: the state's norm ||s_t|| per step and its growth ||s_t|| / ||s_{t-1}|| (the `dynamics` probe's
`norm` and `norm_growth` columns), then where Huginn's zero-shot exit on the KL between successive steps stops
the last token. Random weights again.
"""),
    code('''from workbench.models.native.raven_exits import ZeroShotExit
from workbench.probes.dynamics import norm_growth

raven, raven_tok = load_looped("tiny-raven")   # random weights: 2 Prelude, 2 recurrent, 2 Coda layers; 8 steps
enc = encode_prompts(raven_tok, ["A -> C\\nB -> A\\nC -> B\\nStart at A. Apply the table 2 times.\\nAnswer:"])
with torch.no_grad():
    _, cache = raven.run_with_cache(enc["input_ids"], attention_mask=enc["attention_mask"], loops=16, init_seed=0,
                                    names_filter=["hook_init_state"] + loop_hook_names("state", 16))
    adaptive = raven.adaptive_read(enc["input_ids"], enc["attention_mask"], init_seed=0,
                                   policy=ZeroShotExit("kl", max_loops=16))
s = torch.cat([cache["hook_init_state"][:, -1:], stack_loops(cache, "state", 16)[:, :, -1]])[:, 0]   # [s_0..s_16, d]
norms = s.norm(dim=-1).numpy()
growth = norm_growth(norms[None])[0]
for t in range(1, 17):
    print(f"step {t:2d}: ||s_t|| {norms[t]:.3f}, growth {growth[t - 1]:.3f}")
print(f"zero-shot exit 'kl' (KL between successive steps <= {ZeroShotExit('kl').value}): the last token exits "
      f"at step {int(adaptive.loops_used[0])} of 16")'''),
]

YOUR_PROMPTS = [
    md("""
# 07 · Your own prompts

The other notebooks read the workbench's own task rows. This one starts from text you type: what
each loop "thinks" on a prompt (`wb.lens`), what the model writes with 1, 2, 3, 4 loops
(`wb.generate`), and the probe battery on rows from your own file (`wb.read_user_rows`). The same
three things are commands: `workbench lens`, `workbench generate`, `workbench rows --from` then
`workbench probe --rows` (docs/cli.md).

Two models: the shipped keeper (a retrofit of the embedded SmolLM2-135M trained on the chase, block
12:24 run up to 8 times) and transformers' Inkling2Loop built tiny with **random weights** (its numbers
show what runs, not what a trained model computes).
"""),
    code(ROOT),
    code('''import workbench as wb
from workbench.models import load_looped

keeper, tok, info = wb.load_run(KEEPER)
ink, ink_tok = load_looped("tiny-inkling2-loop")   # random weights: 4 layers, layers 1-2 looped 3 times
print(f"{KEEPER.name}: block {keeper.a}:{keeper.b} of {keeper.n_layers} layers, up to {keeper.max_loops} loops")
print(f"inkling2_loop (random weights): {ink.native_loops} native passes, readable 1..{ink.max_loops}")'''),
    md("""
## What each loop reads

A hand-written chase: start at B; the table sends B to A, A to C, C to B, so the chain is A, C, B and
the answer after 3 applications is B. `wb.lens` runs the loop once to T and decodes every loop's state at
the chosen positions through the Coda (`coda`, the model's own readout) and straight through the final
norm and head (`raw`). At loop T the coda lens is the model's next-token distribution (tests/test_lens.py).
One row per (prompt, position, loop, lens, token); `loop_table` condenses one position.
"""),
    code('''from workbench.lenses import loop_table

PROMPTS = [
    "Function table:\\nA -> C\\nB -> A\\nC -> B\\nD -> D\\nStart at B and apply the table 3 times.\\nAnswer:",
    "The capital of France is",
]
frame = wb.lens(keeper, tok, PROMPTS, loops=4, positions=[-3, -2, -1], targets=["A", "B", "C"])
last = frame[frame.prompt_index == 0].position.max()
for r in loop_table(frame, 0, int(last)).to_dict("records"):
    top = ", ".join(f"{t!r} {p:.2f}" for t, p in r["coda_top"])
    ranks = ", ".join(f"{s} {r[f'coda_rank:{s}']}" for s in "ABC")
    print(f"loop {r['loop']}: coda lens top {top}; entropy {r['coda_entropy']:.2f}; rank {ranks}")'''),
    md("""
The figure: each cell is one (loop, position) of the prompt, its text the coda lens's top token and its
colour that token's probability. Hover for the input token at that position.
"""),
    code('''from workbench.plots.prompt_lens import lens_figure

lens_figure(frame, 0).update_layout(title="The keeper on a hand-written chase: top token per loop and position")'''),
    md("""
## What it writes with 1, 2, 3, 4 loops

`wb.generate` continues each prompt under each loop count (greedy here; `sample=True, seed=...` for
seeded sampling), on the retrofit's exact KV cache. Loop 1 of a retrofit is the base model.
"""),
    code('''runs = wb.generate(keeper, tok, PROMPTS, loops=[1, 2, 3, 4], max_new_tokens=12)
for r in runs.itertuples():
    print(f"prompt {r.prompt_index + 1}, {r.loops} loop{'s' if r.loops > 1 else ' '}: {r.text!r}")'''),
    md("""
## A native looped model, read the same way

`wb.lens` takes a native model too: every pass 1..6 of the tiny Inkling2Loop (3 are native; 4-6 apply the
looped layers again, docs/analyses.md), at every position. **Random weights**: the tokens mean nothing.
"""),
    code('''ink_frame = wb.lens(ink, ink_tok, PROMPTS[1], loops=6, positions="all")
print(ink_frame.attrs["kind"], "model;", ink_frame.attrs["loops"], "passes;", "lenses:", ink_frame.attrs["lenses"])
lens_figure(ink_frame, 0).update_layout(title="Inkling2Loop, random weights: top token per pass and position")'''),
    md("""
## The battery on rows from your own file

A row file is one JSON object a line: `prompt` and `answer` at least (docs/cli.md lists the optional
fields). `wb.read_user_rows` checks every row against the tokenizer and names the first bad one;
`wb.write_manifest` freezes them with their sidecar. Here eight capital cities with a one-token answer
each, so the candidates default to the eight answers. The rows give no depth or chain: the probes that
need them say so instead of running.
"""),
    code('''import tempfile

import pandas as pd

work = Path(tempfile.mkdtemp())
capitals = [("France", "Paris"), ("Italy", "Rome"), ("Germany", "Berlin"), ("Spain", "Madrid"),
            ("Japan", "Tokyo"), ("Egypt", "Cairo"), ("Greece", "Athens"), ("Norway", "Oslo")]
pd.DataFrame({"prompt": [f"The capital of {c} is" for c, _ in capitals],
              "answer": [a for _, a in capitals]}).to_json(work / "capitals.jsonl", orient="records", lines=True)
user = wb.read_user_rows(work / "capitals.jsonl", tok)
wb.write_manifest(user.rows, work / "rows" / "capitals.jsonl", meta=user.meta)
print(len(user.rows), "rows;", user.meta["candidates"], ";", user.meta["depth"])

summary = wb.run_battery(str(KEEPER), None, work / "results", rows=str(work / "rows" / "capitals.jsonl"),
                         progress=False, only=["loop_accuracy", "logit_lens", "lens_agreement", "overshoot"])
for name, result in summary["probes"].items():
    said = "not applicable: " + result["reason"] if "reason" in result else "ran: " + result["headline"]["sentence"]
    print(f"{name:15s}", said)'''),
    code('''from workbench.plots import loop_accuracy_figure

loop_accuracy_figure(pd.read_parquet(work / "results" / "loop_accuracy.parquet")).update_layout(
    title="The keeper on eight capitals: accuracy by loop count")'''),
]

NOTEBOOKS = {
    "01_logit_lens.ipynb": LOGIT_LENS,
    "02_block_selection.ipynb": BLOCK_SELECTION,
    "03_splices_and_overshoot.ipynb": SPLICE_OVERSHOOT,
    "04_heads_and_drift.ipynb": HEADS_DRIFT,
    "05_training_a_small_retrofit.ipynb": TRAINING,
    "06_native_looped_models.ipynb": NATIVE,
    "07_your_own_prompts.ipynb": YOUR_PROMPTS,
}


def kernel_metadata() -> dict:
    """Returns the kernelspec and language_info JupyterLab writes when it starts this project's kernel.

    JupyterLab rewrites both from the running kernel and marks the notebook modified when they
    differ, so they are taken from ipykernel itself (the language_info includes the Python
    version: opening the notebooks with another Python rewrites that one field).
    """
    from ipykernel.ipkernel import IPythonKernel
    from ipykernel.kernelspec import KERNEL_NAME, get_kernel_dict

    spec = get_kernel_dict()
    return {"kernelspec": {"name": KERNEL_NAME, "display_name": spec["display_name"], "language": spec["language"]},
            "language_info": dict(IPythonKernel.language_info)}


def notebook(name: str, cells: list) -> nbformat.NotebookNode:
    """Returns the notebook `name` with deterministic cell ids (so regenerating changes nothing)."""
    stem = name.split("_")[0]
    for i, cell in enumerate(cells):
        cell["id"] = f"nb{stem}-{i:02d}"
    nb = new_notebook(cells=cells)
    nb.metadata.update(kernel_metadata())
    return nb


def render(name: str) -> str:
    """Returns the JSON text of notebook `name` as `build` writes it."""
    return nbformat.writes(notebook(name, [nbformat.from_dict(c) for c in NOTEBOOKS[name]])) + "\n"


def build(folder: Path = HERE) -> list[Path]:
    """Writes every notebook into `folder`; returns their paths."""
    paths = []
    for name in NOTEBOOKS:
        path = folder / name
        path.write_text(render(name))
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in build(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        sys.stdout.write(f"wrote {p}\n")
