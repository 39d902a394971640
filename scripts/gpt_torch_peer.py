#!/usr/bin/env python
"""The independent peer of the GPT experiments (issue 48, item 5): a
character-level GPT in plain PyTorch on the CPU, in FP32 or as Graphcore's
``unit-scaling`` library builds and simulates it in FP8. It imports nothing
from ada_loss; its data (``gpt_peer_data.py`` beside it) is written again
from docs/transformer.md ("Data"): the same text, vocabulary, splits, window
order and evaluation windows as the Chainer runs.

Model (nanoGPT's ``model.py`` shape, written here): token and learned
position embeddings; ``n_layer`` pre-LayerNorm blocks ``x + attn(ln_1(x))``,
``x + mlp(ln_2(x))``; causal multi-head self-attention (one Linear to
q, k, v, ``softmax(q kᵀ / sqrt(d)) v`` by ``F.scaled_dot_product_attention``,
one output Linear); MLP Linear(C, 4C), exact (erf) GELU, Linear(4C, C); a
final LayerNorm; the readout tied to the token embedding. No dropout. No
biases in Linear or LayerNorm layers (nanoGPT's ``bias=False``; ``--bias``
adds them). Init as nanoGPT: weights N(0, 0.02), the two residual output
projections N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm scale 1.

Training: AdamW (betas 0.9, 0.99, eps 1e-8; decoupled weight decay 0.1 on
the 2-D weights only -- embeddings and Linear weights --, none on LayerNorm
scales and biases), learning rate ``lr * (i + 1) / (warmup + 1)`` for step
``i < warmup``, then cosine from ``lr`` to ``min_lr`` at step
``max_iters``; no gradient clipping; loss = mean cross-entropy over the
``batch_size * block_size`` characters of a step.

``--precision``:

* ``fp32``: the model above in float32;
* ``unit_scaling_fp8``: ``unit_scale(simulate_fp8(model))`` -- the library's
  graph transforms as its nanoGPT notebook applies them ("Out-of-the-box
  FP8 training"): every op swapped for its unit-scaled version, residual
  adds rescaled, weights re-initialised to unit scale, and the inputs of
  every matrix product (``F.linear``, ``F.scaled_dot_product_attention``)
  rounded to E4M3 forward and their output gradients to E5M2 backward
  (stochastic rounding, saturating); learning rate 2^-6 decaying to
  2^-6 / 10 unless ``--lr`` is given, as that notebook trains it;
* ``unit_scaling``: the same unit-scaled model in FP32;
* ``fp8``: ``simulate_fp8`` of the plain model (no unit scaling).

Output (``--json``): validation loss in nats per character on the reported
split ``val`` and the selection split ``select`` at every evaluation point,
the training loss of every step, seconds per step, the text's SHA-256 and
the versions used.

Install (its own environment; torch 2.13.0 is the CPU build)::

    python3 -m venv .venv-peer
    .venv-peer/bin/pip install torch==2.13.0 unit-scaling==0.3.5 numpy

Run::

    nice -n 10 .venv-peer/bin/python scripts/gpt_torch_peer.py \\
        --text /path/to/kjv.txt --seed 0 --precision fp32 \\
        --json benchmarks/gpt_peer/fp32_seed0.json
"""
import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time

import numpy
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_peer_data as data  # NOQA

PRECISIONS = ('fp32', 'unit_scaling_fp8', 'unit_scaling', 'fp8')


class SelfAttention(nn.Module):

    def __init__(self, n_embd, n_head, bias):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):

    def __init__(self, n_embd, bias):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):

    def __init__(self, n_embd, n_head, bias):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = SelfAttention(n_embd, n_head, bias)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, bias)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):

    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd,
                 bias):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, bias)
                                    for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight      # tied
        for name, p in self.named_parameters():
            if name.endswith('c_proj.weight'):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith('bias'):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        # the loss inside the model, as nanoGPT's: unit_scale then swaps
        # the cross-entropy for its unit-scaled version too
        T = idx.shape[1]
        # torch.add, not `+`: unit-scaling 0.3.5's unit_scale replaces a
        # plain `+` that is not a residual add by a new node before it looks
        # for the residual adds after it, whose recorded dependencies then
        # miss that node: none is found and the transform fails ("add() got
        # multiple values for argument 'constraint'"). torch.add is swapped
        # for its unit-scaled version in the first pass instead; in FP32 the
        # two are the same operation.
        x = torch.add(self.wte(idx),
                      self.wpe(torch.arange(T, device=idx.device)))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]),
                               targets.view(-1))


def build(precision, vocab_size, args):
    model = GPT(vocab_size, args.block_size, args.n_layer, args.n_head,
                args.n_embd, args.bias)
    if precision == 'fp32':
        return model
    from unit_scaling.transforms import simulate_fp8, unit_scale
    if precision == 'fp8':
        return simulate_fp8(model)
    if precision == 'unit_scaling':
        return unit_scale(model)
    return unit_scale(simulate_fp8(model))


def learning_rate(i, lr, min_lr, warmup, decay_iters):
    """nanoGPT's ``get_lr`` for step ``i`` (0-based)."""
    if i < warmup:
        return lr * (i + 1) / (warmup + 1)
    if i > decay_iters:
        return min_lr
    ratio = (i - warmup) / (decay_iters - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def optimizer(model, weight_decay, betas):
    params = [p for p in model.parameters() if p.requires_grad]
    unique = list({id(p): p for p in params}.values())     # tied once
    groups = [{'params': [p for p in unique if p.dim() >= 2],
               'weight_decay': weight_decay},
              {'params': [p for p in unique if p.dim() < 2],
               'weight_decay': 0.0}]
    return torch.optim.AdamW(groups, lr=0.0, betas=betas, eps=1e-8)


def tensors(ids, starts, block_size):
    x, y = data.windows(ids, starts, block_size)
    return torch.from_numpy(x), torch.from_numpy(y)


@torch.no_grad()
def evaluate(model, corpus, evals, block_size):
    model.eval()
    out = {}
    for split, starts in evals.items():
        losses = [model(*tensors(corpus.splits[split], row, block_size)).item()
                  for row in starts]
        out[split] = float(numpy.mean(losses))
    model.train()
    return out


def write_json(path, record):
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix='.tmp_')
    with os.fdopen(fd, 'w') as f:
        json.dump(record, f, indent=1)
        f.write('\n')
    os.replace(tmp, path)


def versions():
    out = {'python': platform.python_version(), 'torch': torch.__version__,
           'numpy': numpy.__version__}
    try:
        from importlib.metadata import version
        out['unit_scaling'] = version('unit-scaling')
    except Exception:       # not installed: only fp32 can run
        out['unit_scaling'] = None
    return out


def run(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    corpus = data.Corpus(args.text)
    lr = args.lr if args.lr is not None else (
        2.0 ** -6 if args.precision.startswith('unit_scaling') else 1e-3)
    min_lr = args.min_lr if args.min_lr is not None else lr / 10
    model = build(args.precision, len(corpus.vocab), args)
    opt = optimizer(model, args.weight_decay, (args.beta1, args.beta2))
    starts = data.train_starts(corpus, args.block_size, args.batch_size,
                               args.max_iters, args.seed)
    evals = {split: data.eval_starts(corpus, split, args.block_size,
                                     args.batch_size, args.eval_iters)
             for split in ('select', 'val')}
    record = {
        'script': 'scripts/gpt_torch_peer.py', 'argv': sys.argv[1:],
        'precision': args.precision, 'seed': args.seed,
        'config': dict(vars(args), lr=lr, min_lr=min_lr,
                       warmup_iters=args.warmup_iters,
                       eval_seed=data.EVAL_SEED),
        'corpus': {'path': os.path.abspath(args.text),
                   'sha256': corpus.sha256, 'vocab_size': len(corpus.vocab),
                   'chars': len(corpus.ids),
                   'splits': {k: len(v) for k, v in corpus.splits.items()}},
        'parameters': sum(p.numel() for p in
                          {id(p): p for p in model.parameters()}.values()),
        'versions': versions(), 'threads': torch.get_num_threads(),
        'eval': [], 'train_loss': [], 'diverged_at': None,
    }
    step_seconds, eval_seconds = [], []
    begin = time.time()
    for i in range(args.max_iters + 1):
        if i % args.eval_interval == 0 or i == args.max_iters:
            t = time.perf_counter()
            losses = evaluate(model, corpus, evals, args.block_size)
            eval_seconds.append(time.perf_counter() - t)
            record['eval'].append(dict(step=i, **losses))
            print('step {:5d}  select {:.4f}  val {:.4f}  ({:.0f} s)'.format(
                i, losses['select'], losses['val'], time.time() - begin),
                flush=True)
        if i == args.max_iters:
            break
        for group in opt.param_groups:
            group['lr'] = learning_rate(i, lr, min_lr, args.warmup_iters,
                                        args.max_iters)
        t = time.perf_counter()
        loss = model(*tensors(corpus.splits['train'], starts[i],
                              args.block_size))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step_seconds.append(time.perf_counter() - t)
        value = loss.item()
        record['train_loss'].append(value)
        if not math.isfinite(value):
            record['diverged_at'] = i
            print('step {}: loss {} -- stopped'.format(i, value), flush=True)
            break
        if args.log_interval and i % args.log_interval == 0:
            print('step {:5d}  train {:.4f}  {:.3f} s/step'.format(
                i, value, step_seconds[-1]), flush=True)
    final = record['eval'][-1] if record['diverged_at'] is None else {}
    record['final'] = {'step': final.get('step'), 'val': final.get('val'),
                       'select': final.get('select')}
    record['seconds_per_step'] = {
        'median': float(numpy.median(step_seconds)),
        'mean': float(numpy.mean(step_seconds))}
    record['seconds_per_eval'] = float(numpy.median(eval_seconds))
    record['wall_seconds'] = time.time() - begin
    if args.json:
        write_json(args.json, record)
    return record


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--text', required=True,
                   help='the corpus text file (kjv.txt, docs/transformer.md)')
    p.add_argument('--precision', choices=PRECISIONS, default='fp32')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--max-iters', type=int, default=2000)
    p.add_argument('--batch-size', type=int, default=12)
    p.add_argument('--block-size', type=int, default=64)
    p.add_argument('--n-layer', type=int, default=4)
    p.add_argument('--n-head', type=int, default=4)
    p.add_argument('--n-embd', type=int, default=128)
    p.add_argument('--bias', action='store_true',
                   help='biases in Linear and LayerNorm layers')
    p.add_argument('--lr', type=float, default=None,
                   help='peak learning rate (default 1e-3; 2^-6 for the '
                   'unit-scaled precisions)')
    p.add_argument('--min-lr', type=float, default=None,
                   help='final learning rate (default lr / 10)')
    p.add_argument('--warmup-iters', type=int, default=100)
    p.add_argument('--weight-decay', type=float, default=0.1)
    p.add_argument('--beta1', type=float, default=0.9)
    p.add_argument('--beta2', type=float, default=0.99)
    p.add_argument('--eval-interval', type=int, default=250)
    p.add_argument('--eval-iters', type=int, default=data.EVAL_ITERS)
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--log-interval', type=int, default=100)
    p.add_argument('--json', default=None, help='write the record here')
    return p.parse_args(argv)


if __name__ == '__main__':
    run(parse_args())
