"""Analytic costs of a looped model's passes: layer counts and FLOP counts.

FLOP formula (multiply-adds count 2; elementwise work, norms, rotary, softmax and the
optimizer update are left out: together they are a few per cent of a pass here):

- a decoder layer on `rows` x `seq` tokens (padding included: the model computes on it):
    2 * P_layer * rows * seq                          (q, k, v, o and the gated MLP)
  + 4 * rows * seq^2 * n_heads * head_dim             (Q K^T and A V; eager attention computes
                                                       the full seq x seq square, masked or not)
  with P_layer = d * H * hd + 2 * d * KV * hd + H * hd * d + 3 * d * d_ff.
- the split bridge at loops t >= 2: 2 * 2 * d^2 per token (W_p and W_s); additive injection: 0.
- a readout: 2 * d * n_columns per read position (n_columns = candidates or the vocabulary).

A backward pass costs, per matmul: x1 of its forward for the input gradient where one is
needed, x1 more for the weight gradient where the weight trains. Attention products always
need both operands' gradients (x2). Layers upstream of every trainable tensor (the Prelude)
have no backward.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Split:
    """Shapes of a decoder and its loop split: prelude layers a, block k = b - a, coda L - b."""

    d: int
    heads: int
    kv_heads: int
    head_dim: int
    d_ff: int
    vocab: int
    n_layers: int
    a: int
    b: int
    bridge: bool = True

    @property
    def k(self) -> int:
        return self.b - self.a

    @property
    def coda(self) -> int:
        return self.n_layers - self.b

    @property
    def layer_params(self) -> int:
        attn = self.d * self.heads * self.head_dim * 2 + 2 * self.d * self.kv_heads * self.head_dim
        return attn + 3 * self.d * self.d_ff


def split_of(looped) -> Split:
    """Returns the Split of a LoopedLM (from its base config)."""
    c = looped.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return Split(d=c.hidden_size, heads=c.num_attention_heads, kv_heads=c.num_key_value_heads,
                 head_dim=head_dim, d_ff=c.intermediate_size, vocab=c.vocab_size,
                 n_layers=looped.n_layers, a=looped.a, b=looped.b,
                 bridge=hasattr(looped.reentry, "state_proj"))


# ----------------------------------------------------------------------------- layer counts
def layers_one_pass_read(s: Split, T: int) -> int:
    """Layer executions of `read(loops=T)`: prelude + T x block + T x coda (the coda reads every loop)."""
    return s.a + T * s.k + T * s.coda


def layers_last_loop(s: Split, t: int) -> int:
    """Layer executions of one pass to loop t that reads only loop t: prelude + t x block + coda."""
    return s.a + t * s.k + s.coda


def layers_reruns(s: Split, T: int) -> int:
    """Layer executions of T per-depth reruns, each reading only its last loop."""
    return sum(layers_last_loop(s, t) for t in range(1, T + 1))


# ----------------------------------------------------------------------------- FLOPs
def layer_flops(s: Split, rows: int, seq: int) -> float:
    """Forward FLOPs of one decoder layer on rows x seq tokens."""
    return 2.0 * s.layer_params * rows * seq + attention_flops(s, rows, seq)


def attention_flops(s: Split, rows: int, seq: int) -> float:
    """Forward FLOPs of Q K^T and A V of one layer."""
    return 4.0 * rows * seq * seq * s.heads * s.head_dim


def bridge_flops(s: Split, rows: int, seq: int) -> float:
    """Forward FLOPs of one re-entry (loops t >= 2)."""
    return 4.0 * s.d * s.d * rows * seq if s.bridge else 0.0


def head_flops(s: Split, read_tokens: int, columns: int) -> float:
    """Forward FLOPs of scoring `columns` unembedding rows at `read_tokens` positions in all."""
    return 2.0 * s.d * columns * read_tokens


def pass_flops(s: Split, rows: int, seq: int, loops: int, coda_reads: int, read_tokens: int, columns: int) -> float:
    """Forward FLOPs of a pass to `loops` that runs the coda `coda_reads` times and each time
    scores `columns` at `read_tokens` positions."""
    layer = layer_flops(s, rows, seq)
    return ((s.a + loops * s.k + coda_reads * s.coda) * layer + (loops - 1) * bridge_flops(s, rows, seq)
            + coda_reads * head_flops(s, read_tokens, columns))


def one_pass_read_flops(s: Split, rows: int, seq: int, T: int, candidates: int) -> float:
    """`read(loops=T, candidates=C)` at one position per row."""
    return pass_flops(s, rows, seq, T, T, rows, candidates)


def last_loop_flops(s: Split, rows: int, seq: int, t: int, candidates: int) -> float:
    """A pass to loop t reading only loop t, candidates at one position per row."""
    return pass_flops(s, rows, seq, t, 1, rows, candidates)


def forward_flops(s: Split, rows: int, seq: int, t: int) -> float:
    """`forward(loops=t)`: full-vocabulary logits at every position of the last loop."""
    return pass_flops(s, rows, seq, t, 1, rows * seq, s.vocab)


def full_stack_flops(s: Split, rows: int, seq: int, T: int) -> float:
    """The reference stack: full-vocabulary logits at every position of every loop."""
    return pass_flops(s, rows, seq, T, T, rows * seq, s.vocab)


def train_step_flops(s: Split, rows: int, seq: int, T: int, candidates: int, full_vocab: bool = False) -> float:
    """Forward + backward FLOPs of a per-loop-supervised step with the block and re-entry trained.

    Backward: block layers x2 (input and weight gradients) every loop; coda layers x1 for the
    linear maps (frozen: input gradient only) and x2 for attention; the bridge x2 (W_s and W_p
    both need input and weight gradients: the LayerNorm before W_p trains); the readout x1
    (frozen unembedding); nothing for the Prelude.
    """
    layer = layer_flops(s, rows, seq)
    attn = attention_flops(s, rows, seq)
    read_tokens, columns = (rows * seq, s.vocab) if full_vocab else (rows, candidates)
    forward = pass_flops(s, rows, seq, T, T, read_tokens, columns)
    block_bwd = 2 * layer
    coda_bwd = (layer - attn) + 2 * attn
    bridge_bwd = 2 * bridge_flops(s, rows, seq)  # W_s and W_p: input and weight (the LayerNorm on p trains)
    backward = (T * s.k * block_bwd + T * s.coda * coda_bwd + (T - 1) * bridge_bwd
                + T * head_flops(s, read_tokens, columns))
    return forward + backward
