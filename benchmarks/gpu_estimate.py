"""What a GPU user should expect: memory and time per training step of the default recipe (docs/gpu.md).

The default recipe (LoRA r16 on the looped block, bridge re-entry, per-loop chain loss over the
row's symbols, preservation KL at loop 1 on 8 rehearsal rows x 16 positions, AdamW, batch 8) at
the paper's setting: N = 16 symbols, support 8 (a batch runs up to 8 loops), for SmolLM2-135M
(block 12:24 of 30, the default) and Qwen2.5-0.5B (block 10:20 of 24: the same 2/5 of the depth).

Measured here, on the CPU, with the model's real shapes (Qwen2.5-0.5B is built from its config
with random weights: shapes, not values, set memory and FLOPs):
- bytes autograd saves for the backward of one step (`torch.autograd.graph.saved_tensors_hooks`,
  storages counted once), in bf16 (frozen weights bf16, autocast) and fp32;
- the step's wall time on this CPU (one warm step), against the analytic FLOPs of the step.
Computed: parameter, gradient and optimizer bytes; the FLOP count (benchmarks/flops.py's
formulas with a frozen block: the LoRA path's backward is input gradients only, plus its r-dim
weights). The GPU time is a projection, FLOPs / (achieved rate), for stated rates; see docs/gpu.md.

    .venv/bin/python benchmarks/gpu_estimate.py --out benchmarks/results/gpu_estimate.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.flops import Split, attention_flops, bridge_flops, head_flops, layer_flops  # noqa: E402

MODELS = {
    # name: (config kwargs of the HF family, block)
    "SmolLM2-135M": (dict(model_type="llama", hidden_size=576, num_attention_heads=9, num_key_value_heads=3,
                          intermediate_size=1536, num_hidden_layers=30, vocab_size=49152, head_dim=64,
                          tie_word_embeddings=True, rope_theta=100000.0), (12, 24)),
    "Qwen2.5-0.5B": (dict(model_type="qwen2", hidden_size=896, num_attention_heads=14, num_key_value_heads=2,
                          intermediate_size=4864, num_hidden_layers=24, vocab_size=151936, head_dim=64,
                          tie_word_embeddings=True, rope_theta=1000000.0), (10, 20)),
}
BATCH, N, SUPPORT, LORA_R = 8, 16, 8, 16
KL_ROWS, KL_POSITIONS = 8, 16


def split(cfg: dict, block) -> Split:
    return Split(d=cfg["hidden_size"], heads=cfg["num_attention_heads"], kv_heads=cfg["num_key_value_heads"],
                 head_dim=cfg["head_dim"], d_ff=cfg["intermediate_size"], vocab=cfg["vocab_size"],
                 n_layers=cfg["num_hidden_layers"], a=block[0], b=block[1], bridge=True)


def lora_params(s: Split, r: int = LORA_R) -> int:
    """LoRA r on the 7 projections of each block layer: r x (in + out) each."""
    per_layer = (r * (s.d + s.heads * s.head_dim) + 2 * r * (s.d + s.kv_heads * s.head_dim)
                 + r * (s.heads * s.head_dim + s.d) + 2 * r * (s.d + s.d_ff) + r * (s.d_ff + s.d))
    return per_layer * s.k


def step_flops(s: Split, rows: int, seq: int, T: int, candidates: int, kl_seq: int) -> float:
    """Forward + backward FLOPs of one default-recipe step (frozen block with LoRA, bridge trained).

    Backward: block and coda layers need input gradients (x1 of their linear maps, x2 of attention);
    LoRA's own weights are r-dimensional (left out: under 3% at r = 16); the bridge x2; the readout x1;
    the Prelude none. The KL adds a teacher forward and a student forward + backward at loop 1
    (full vocabulary at KL_POSITIONS positions of each rehearsal row).
    """
    layer, attn = layer_flops(s, rows, seq), attention_flops(s, rows, seq)
    fwd = (s.a + T * s.k + T * s.coda) * layer + (T - 1) * bridge_flops(s, rows, seq) + T * head_flops(s, rows,
                                                                                                         candidates)
    frozen_bwd = (layer - attn) + 2 * attn
    bwd = T * (s.k + s.coda) * frozen_bwd + (T - 1) * 2 * bridge_flops(s, rows, seq) + T * head_flops(s, rows,
                                                                                                      candidates)
    kl_layer, kl_attn = layer_flops(s, KL_ROWS, kl_seq), attention_flops(s, KL_ROWS, kl_seq)
    kl_fwd = s.n_layers * kl_layer + head_flops(s, KL_ROWS * KL_POSITIONS, s.vocab)
    kl_bwd = (s.k + s.coda) * ((kl_layer - kl_attn) + 2 * kl_attn) + head_flops(s, KL_ROWS * KL_POSITIONS, s.vocab)
    return fwd + bwd + 2 * kl_fwd + kl_bwd


def static_bytes(s: Split, precision: str) -> dict:
    """Weights (frozen in bf16 or fp32), trained tensors fp32 with their gradients and AdamW's two moments."""
    embed = s.vocab * s.d
    frozen = s.n_layers * s.layer_params + embed + (2 * s.n_layers + 1) * s.d   # tied head; norms
    trained = lora_params(s) + 2 * s.d * s.d + 2 * s.d + s.d   # LoRA + bridge W_p, W_s (+ norm, gate)
    wbytes = 2 if precision == "bf16" else 4
    return {"frozen_params": frozen, "trained_params": trained, "weights": frozen * wbytes + trained * 4,
            "grads_and_adam": trained * 12}


def layer_saved_bytes(s: Split, seq: int, precision: str) -> float:
    """Bytes one decoder-layer execution saves for backward, per token (frozen weights, LoRA on its projections).

    Saved: both norms' inputs (fp32 residual stream), the projections' inputs (the normed stream once in fp32;
    under bf16 autocast each of the q/k/v, LoRA-A and gate/up calls saves its own bf16 cast), Q and the
    repeated K and V (H x hd each), the attention probabilities (fp32 softmax output; plus a bf16 cast under
    autocast), o_proj's input, and the MLP's gate, SiLU, up and down inputs (d_ff each).
    """
    d, h, hd, ff = s.d, s.heads, s.head_dim, s.d_ff
    if precision == "fp32":
        return 4.0 * (5 * d + 4 * h * hd + h * seq + 4 * ff)
    return 4.0 * 2 * d + 2.0 * (4 * d + 2 * d + 4 * h * hd + 4 * ff) + 4.0 * h * seq + 2.0 * h * seq


def saved_bytes(s: Split, rows: int, seq: int, T: int, precision: str, kl_seq: int = 64) -> float:
    """Saved-for-backward bytes of one step: block and Coda layers at every loop (the Prelude saves nothing:
    no tensor upstream of it trains), and the KL's student pass at loop 1."""
    main = T * (s.k + s.coda) * rows * seq * layer_saved_bytes(s, seq, precision)
    kl = (s.k + s.coda) * KL_ROWS * kl_seq * layer_saved_bytes(s, kl_seq, precision)
    return main + kl


def measure(name: str, cfg: dict, block, precision: str, T: int, seq_tokens: list[int], timed: bool,
            count_ops: bool = False) -> dict:
    """Saved-for-backward bytes (and the wall time) of one real step on this CPU."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from workbench.loop.config import Block, LoraSettings, RetrofitConfig
    from workbench.loop.surgery import retrofit
    from workbench.precision import apply_precision

    kind = cfg["model_type"]
    config = AutoConfig.for_model(kind, **{k: v for k, v in cfg.items() if k != "model_type"})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    looped = retrofit(base, RetrofitConfig(Block(*block), reentry="bridge", max_loops=T,
                                           lora=LoraSettings(r=LORA_R, alpha=2 * LORA_R, dropout=0.0)))
    for p in looped.parameters():
        p.requires_grad_(False)
    trained = [p for n, p in looped.named_parameters() if "lora_" in n or n.startswith("reentry.")]
    for p in trained:
        p.requires_grad_(True)
    apply_precision(looped, precision)
    seq = max(seq_tokens)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(100, 1000, (BATCH, seq), generator=g)
    mask = torch.ones_like(ids)
    cands = torch.randint(100, 1000, (BATCH, N), generator=g)
    targets = torch.randint(0, N, (BATCH, T), generator=g)
    kl_ids = torch.randint(100, 1000, (KL_ROWS, 64), generator=g)
    kl_pos = torch.arange(64 - KL_POSITIONS, 64).expand(KL_ROWS, -1)
    storages: dict[int, int] = {}

    def pack(t):
        try:
            st = t.untyped_storage()
            storages[st.data_ptr()] = max(storages.get(st.data_ptr(), 0), st.nbytes())
        except (RuntimeError, NotImplementedError):
            pass
        return t

    def step(backward: bool = True):
        storages.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            r = looped.read(ids, attention_mask=mask, loops=T, candidates=cands)
            logp = r.scores[:, :, -1, :].float().log_softmax(-1)
            loss = -logp.gather(-1, targets.unsqueeze(-1)).mean()
            with torch.no_grad(), _adapter_off(looped):
                t_scores = looped.read(kl_ids, loops=1, positions=kl_pos).scores
            s_scores = looped.read(kl_ids, loops=1, positions=kl_pos).scores
            lt, ls = t_scores[:, 0].float().log_softmax(-1), s_scores[:, 0].float().log_softmax(-1)
            loss = loss + 20.0 * (lt.exp() * (lt - ls)).sum(-1).mean()
        saved = sum(storages.values())
        if not backward:
            return saved
        loss.backward()
        for p in trained:
            p.grad = None
        return saved

    if count_ops:   # aten operations of one whole step (forward, KL, backward): each is a kernel launch on a GPU
        from torch.utils._python_dispatch import TorchDispatchMode

        class Count(TorchDispatchMode):
            n = 0

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                Count.n += 1
                return func(*args, **(kwargs or {}))

        with Count():
            saved = step()
        return {"saved_bytes": saved, "aten_ops": Count.n, "cpu_step_s": None}
    if not timed:
        return {"saved_bytes": step(backward=False), "cpu_step_s": None}
    step()   # warm
    t0 = time.perf_counter()
    saved = step()
    wall = time.perf_counter() - t0
    return {"saved_bytes": saved, "cpu_step_s": round(wall, 2)}


class _adapter_off:
    def __init__(self, looped):
        from peft.tuners.lora import LoraLayer

        self.layers = [m for m in looped.modules() if isinstance(m, LoraLayer)]

    def __enter__(self):
        for m in self.layers:
            m.enable_adapters(False)

    def __exit__(self, *exc):
        for m in self.layers:
            m.enable_adapters(True)


def prompt_tokens() -> list[int]:
    """Token counts of N = 16 chase prompts at depths 1-8 (SmolLM2's tokenizer; Qwen2.5's is assumed alike)."""
    from workbench.models import load_tokenizer
    from workbench.tasks import build_rows

    tok = load_tokenizer("smollm2-135m-instruct")
    rows = build_rows("chase", list(range(1, SUPPORT + 1)), 4, 5, alphabet=N, tokenizer=tok)
    return [len(tok(r["prompt"]).input_ids) for r in rows]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--no-time", action="store_true", help="measure saved bytes only (one forward, no timed step)")
    p.add_argument("--measure", default="SmolLM2-135M", help="models whose saved bytes are measured (comma list)")
    p.add_argument("--count-ops", action="store_true", help="count the aten operations of a step (T = 1, 2)")
    p.add_argument("--measure-loops", type=int, default=None, help="loops of the measured step (default the support; "
                   "the model is linear in the loops, so a shorter one calibrates it)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    seqs = prompt_tokens()
    seq = max(seqs)
    out = {"setting": {"batch": BATCH, "N": N, "support_loops": SUPPORT, "prompt_tokens_max": seq,
                       "prompt_tokens_min": min(seqs), "lora_r": LORA_R, "kl": [KL_ROWS, KL_POSITIONS, 64]},
           "machine": {"threads": torch.get_num_threads(), "torch": torch.__version__}, "models": {}}
    calibration = None
    for name in args.models.split(","):
        cfg, block = MODELS[name]
        s = split(cfg, block)
        flops = step_flops(s, BATCH, seq, SUPPORT, N, 64)
        rec = {"block": list(block), "flops_per_step": flops}
        if name in args.measure.split(","):   # the model's real saved bytes at this exact shape, fp32, forward only
            T = args.measure_loops or SUPPORT
            m = measure(name, cfg, block, "fp32", T, seqs, timed=not args.no_time)
            rec["measured_fp32"] = {**m, "loops": T}
            calibration = m["saved_bytes"] / saved_bytes(s, BATCH, seq, T, "fp32")
            rec["measured_over_model"] = round(calibration, 3)
        for precision in ("bf16", "fp32"):
            st = static_bytes(s, precision)
            act = saved_bytes(s, BATCH, seq, SUPPORT, precision)
            rec[precision] = {**st, "saved_model": act, "saved_calibrated": act * (calibration or 1.0),
                              "total_bytes": st["weights"] + st["grads_and_adam"] + act * (calibration or 1.0)}
        print(name, json.dumps(rec), flush=True)
        out["models"][name] = rec
    out["calibration"] = calibration
    if args.count_ops:   # ops(T) = c0 + c1 T from T = 1 and 2 (SmolLM2's shapes; the op count does not depend on them)
        cfg, block = MODELS["SmolLM2-135M"]
        ops = {T: measure("SmolLM2-135M", cfg, block, "fp32", T, [32], timed=False, count_ops=True)["aten_ops"]
               for T in (1, 2)}
        out["aten_ops"] = {"T1": ops[1], "T2": ops[2], "per_loop": ops[2] - ops[1],
                           f"T{SUPPORT}": ops[1] + (SUPPORT - 1) * (ops[2] - ops[1])}
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
