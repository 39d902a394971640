"""A decoder-only transformer (GPT-2's block; nanoGPT's model) in Chainer.

Pre-LayerNorm blocks, causal multi-head self-attention, a GELU MLP of
4× width, learned token and position embeddings, no dropout, optionally the
token embedding tied to the readout (Radford et al. 2019; Karpathy's
nanoGPT ``model.py``, whose CPU configuration gives the defaults: 4 layers,
4 heads, width 128, block 64).

Every GEMM is scale-aware, so every loss-scaling mode and precision applies
(docs/transformer.md): the Linear layers are :class:`ada_loss.links.Linear`,
attention's Q·Kᵀ and P·V are :class:`ada_loss.links.MatMul` (GEMMs of two
activations, a β per input gradient: docs/modes.md), and the tied readout
is :class:`ada_loss.links.TiedLinear`, a GEMM link on the embedding's
weight. LayerNorm and the attention softmax run in FP32 on float16
activations (mixed16), as batch normalization does here (FP32
statistics).

Link paths (the layers' names): ``wte``, ``wpe``, ``blocks/<i>/ln1``,
``blocks/<i>/attn/c_attn``, ``.../attn/qk``, ``.../attn/pv``,
``.../attn/c_proj``, ``blocks/<i>/ln2``, ``blocks/<i>/mlp/c_fc``,
``.../mlp/c_proj``, ``ln_f``, ``lm_head``.
"""
import math

import chainer
import chainer.functions as F
import chainer.links as L
import numpy

from ada_loss import functions as AF
from ada_loss import links as AL

#: nanoGPT's CPU configuration (its README's command for a CPU: 4 layers,
#: 4 heads, width 128, block 64, batch 12, no dropout).
DEFAULTS = dict(n_layer=4, n_head=4, n_embd=128, block_size=64)

_STATS = ('tensor', 'head')


def _normal(scale):
    return chainer.initializers.Normal(scale)


def _fp32(fn, x):
    """``fn(x)`` computed in FP32, the result in x's dtype (mixed16: FP32
    statistics of LayerNorm and softmax, as batch norm's)."""
    if x.dtype == numpy.float16:
        return F.cast(fn(F.cast(x, numpy.float32)), numpy.float16)
    return fn(x)


class LayerNorm(chainer.Chain):
    """LayerNormalization over the last axis of (..., C), FP32 parameters
    and statistics whatever the activations' dtype; ``bias=False``: the
    scale γ only (nanoGPT's ``bias=False``; Chainer's link always has a β,
    so it is removed and the normalization runs with a constant zero)."""

    def __init__(self, size, eps=1e-5, bias=True):
        super(LayerNorm, self).__init__()
        with self.init_scope(), chainer.using_config('dtype',
                                                     numpy.float32):
            self.ln = L.LayerNormalization(size, eps=eps)
        if not bias:
            del self.ln.beta

    def forward(self, x):
        shape = x.shape
        ln = self.ln

        def norm(h):
            h = F.reshape(h, (-1, shape[-1]))
            if hasattr(ln, 'beta'):
                h = ln(h)
            else:
                h = F.layer_normalization(
                    h, ln.gamma, self.xp.zeros_like(ln.gamma.array), ln.eps)
            return F.reshape(h, shape)
        return _fp32(norm, x)


class CausalSelfAttention(chainer.Chain):
    """Multi-head causal self-attention: ``c_attn`` (C → 3C), per head
    softmax(Q·Kᵀ/√d + mask)·V, ``c_proj`` (C → C)."""

    def __init__(self, n_embd, n_head, n_layer, stat='tensor',
                 attention_format=None, bias=True):
        super(CausalSelfAttention, self).__init__()
        if n_embd % n_head:
            raise ValueError('n_embd ({}) must be a multiple of n_head ({})'
                             .format(n_embd, n_head))
        if stat not in _STATS:
            raise ValueError('attention_stat must be one of {}, got {!r}'
                             .format(', '.join(_STATS), stat))
        self.n_head = n_head
        axis = 1 if stat == 'head' else None   # (B, H, T, ·): heads
        with self.init_scope():
            self.c_attn = AL.Linear(n_embd, 3 * n_embd, nobias=not bias,
                                    initialW=_normal(0.02))
            self.qk = AL.MatMul(axis, attention_format)
            self.pv = AL.MatMul(axis, attention_format)
            # GPT-2's scaled init of the projections into the residual
            self.c_proj = AL.Linear(n_embd, n_embd, nobias=not bias,
                                    initialW=_normal(
                                        0.02 / math.sqrt(2 * n_layer)))

    def forward(self, x):
        B, T, C = x.shape
        H = self.n_head
        d = C // H
        qkv = self.c_attn(x, n_batch_axes=2)

        def heads(h):      # (B, T, C) -> (B, H, T, d)
            return F.transpose(F.reshape(h, (B, T, H, d)), (0, 2, 1, 3))
        q, k, v = [heads(h) for h in F.split_axis(qkv, 3, axis=2)]
        s = self.qk(q, F.transpose(k, (0, 1, 3, 2))) * (1.0 / math.sqrt(d))
        xp = self.xp
        causal = xp.tril(xp.ones((T, T), dtype=bool))
        causal = xp.broadcast_to(causal, s.shape)
        s = F.where(causal, s, xp.full(s.shape, -numpy.inf, s.dtype))
        p = _fp32(lambda h: F.softmax(h, axis=3), s)
        y = self.pv(p, v)
        y = F.reshape(F.transpose(y, (0, 2, 1, 3)), (B, T, C))
        return self.c_proj(y, n_batch_axes=2)


class MLP(chainer.Chain):
    """``c_fc`` (C → 4C), GELU, ``c_proj`` (4C → C)."""

    def __init__(self, n_embd, n_layer, bias=True):
        super(MLP, self).__init__()
        with self.init_scope():
            self.c_fc = AL.Linear(n_embd, 4 * n_embd, nobias=not bias,
                                  initialW=_normal(0.02))
            self.c_proj = AL.Linear(4 * n_embd, n_embd, nobias=not bias,
                                    initialW=_normal(
                                        0.02 / math.sqrt(2 * n_layer)))

    def forward(self, x):
        return self.c_proj(AF.gelu(self.c_fc(x, n_batch_axes=2)),
                           n_batch_axes=2)


class Block(chainer.Chain):
    """x + attn(ln1(x)), then x + mlp(ln2(x)) (pre-LayerNorm)."""

    def __init__(self, n_embd, n_head, n_layer, stat='tensor',
                 attention_format=None, bias=True):
        super(Block, self).__init__()
        with self.init_scope():
            self.ln1 = LayerNorm(n_embd, bias=bias)
            self.attn = CausalSelfAttention(n_embd, n_head, n_layer, stat,
                                            attention_format, bias)
            self.ln2 = LayerNorm(n_embd, bias=bias)
            self.mlp = MLP(n_embd, n_layer, bias)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(chainer.Chain):
    """The GPT: token ids (B, T) int32 → logits (B, T, vocab_size).

    Args:
        vocab_size (int): number of tokens (the corpus's characters).
        n_layer, n_head, n_embd, block_size (int): depth, heads, width,
            longest sequence (:data:`DEFAULTS`).
        tie_weights (bool): the readout is the token embedding's transpose
            (:class:`ada_loss.links.TiedLinear`; nanoGPT's default) instead
            of its own
            Linear ``lm_head`` (no bias either way).
        attention_stat (str): ``'tensor'`` (default) or ``'head'``: how
            Algorithm 4 reads attention's GEMMs (docs/modes.md).
        attention_format (str or None): a format attention's two GEMMs
            keep whatever the precision (``'bfloat16'``, ``'float32'``;
            docs/precisions.md), or None: the precision's.
        bias (bool): biases in the Linear layers and β in the LayerNorms
            (GPT-2's); False: none (nanoGPT's ``bias=False``, the peer's).
    """

    def __init__(self, vocab_size, n_layer=4, n_head=4, n_embd=128,
                 block_size=64, tie_weights=False, attention_stat='tensor',
                 attention_format=None, bias=True):
        super(GPT, self).__init__()
        for name, v in (('vocab_size', vocab_size), ('n_layer', n_layer),
                        ('n_head', n_head), ('n_embd', n_embd),
                        ('block_size', block_size)):
            if not isinstance(v, (int, numpy.integer)) or v < 1:
                raise ValueError('{} must be a positive integer, got {!r}'
                                 .format(name, v))
        self.block_size = int(block_size)
        self.tie_weights = bool(tie_weights)
        with self.init_scope():
            self.wte = L.EmbedID(vocab_size, n_embd, initialW=_normal(0.02))
            self.wpe = L.EmbedID(block_size, n_embd, initialW=_normal(0.02))
            self.blocks = chainer.ChainList(*[
                Block(n_embd, n_head, n_layer, attention_stat,
                      attention_format, bias) for _ in range(n_layer)])
            self.ln_f = LayerNorm(n_embd, bias=bias)
            if self.tie_weights:
                self.lm_head = AL.TiedLinear(self.wte)
            else:
                self.lm_head = AL.Linear(n_embd, vocab_size, nobias=True,
                                         initialW=_normal(0.02))

    def forward(self, idx):
        idx = chainer.as_variable(idx).array
        if idx.ndim != 2:
            raise ValueError('GPT takes token ids of shape (batch, time), '
                             'got {}'.format(idx.shape))
        B, T = idx.shape
        if T > self.block_size:
            raise ValueError('sequence of length {} is longer than the '
                             'block size {}'.format(T, self.block_size))
        pos = self.xp.arange(T, dtype=numpy.int32)
        x = self.wte(idx) + F.broadcast_to(self.wpe(pos), (B, T,
                                                           self.wpe.W.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x), n_batch_axes=2)


def lm_loss(logits, targets):
    """Mean softmax cross-entropy over the B·T tokens, in FP32 (the logits
    of mixed16 are cast first, as the Classifier does)."""
    B, T, V = logits.shape
    if logits.dtype != numpy.float32:
        logits = F.cast(logits, numpy.float32)
    return F.softmax_cross_entropy(F.reshape(logits, (B * T, V)),
                                   targets.reshape(B * T))


def lm_accuracy(logits, targets):
    """The share of the B·T tokens whose most likely next token is right
    (a Variable, no gradient)."""
    B, T, V = logits.shape
    return F.accuracy(F.reshape(logits, (B * T, V)), targets.reshape(B * T))
