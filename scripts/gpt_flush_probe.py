#!/usr/bin/env python
"""Share of the nonzero gradient entries flushed to zero on entering each
GEMM of the GPT (the per-GEMM probe, ada_loss/analysis/gemm_probe.py), for
the second of two backward passes per mode on one batch at initialization
(``init_scale=amax|auto`` set α_{N+1} from the pass before; no update in
between).

Model: nanoGPT's CPU shape (4 layers, 4 heads, width 128, block 64) by
default, batch 12 (B·T = 768 tokens in the mean loss), vocabulary 65,
random token ids (the corpus is not needed to see the loss gradient's
magnitude at initialization: |p − y| / 768). Printed per mode: the largest
flush share (``uf_in``) over the GEMMs and where, the loss gradient's
(``lm_head``), attention's (the largest over its ``:a``/``:b`` rows) and the
share of GEMMs at or below 0.1 % (``-``: every entry entering was
zero already, flushed before).

At a trained state (``--text FILE --train-steps N``): the model is first
trained in FP32 for N steps on the characters of a text file (plain
backprop, Adam with nanoGPT's settings: lr 1e-3, betas (0.9, 0.99), weight
decay 0.1 on the matrices as AdamW applies it (W shrinks by lr·0.1 a
step), batch and block as given, random windows drawn with ``--seed``; its vocabulary is the file's characters), and every mode is
probed from those weights on a batch of windows of the same text (not one
trained on). The trained state is FP32's, not each mode's own: what is
measured is how each mode scales the gradients of a model that has
learned something (the loss gradient shrinks as p → y).

At the end of a run of the GPT table (``--run RUN_FOLDER``): the run's own
trained weights (its ``snapshot_latest``, read without pickles, refused
unless it holds the run's last iteration), its model shape, corpus
(``data.kjv_root`` as the run had it, or ``$ADA_LOSS_KJV_ROOT``; the
corpus's SHA-256 must equal the run's) and precision (``--precision`` is
ignored), probed on the first of the fixed ``val`` evaluation batches —
the weights each mode actually reached, not FP32's.

Run:  .venv/bin/python scripts/gpt_flush_probe.py [--precision fp8_e4m3]
          [--modes adaptive adaptive:init_scale=amax ...]
          [--text kjv.txt --train-steps 200 | --run RUN_FOLDER]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

import numpy  # NOQA: E402

from ada_loss.analysis.gemm_probe import ProbingLossScaling  # NOQA: E402
from ada_loss.models.gpt import GPT, lm_loss  # NOQA: E402
from ada_loss.scaling import make_loss_scaling  # NOQA: E402
from ada_loss.training import apply_precision, dtype_config  # NOQA: E402


def _windows(ids, rng, batch, block):
    """``batch`` random windows of ``block + 1`` tokens: (inputs,
    targets)."""
    starts = rng.randint(0, len(ids) - block - 1, batch)
    w = numpy.stack([ids[i:i + block + 1] for i in starts])
    return w[:, :-1], w[:, 1:]


def _train_fp32(args, ids, vocab):
    """The GPT's parameters after ``args.train_steps`` FP32 steps on
    ``ids`` ({path: array}), with the last training loss."""
    import chainer
    numpy.random.seed(args.seed)
    m = GPT(vocab, block_size=args.block, attention_stat=args.attention_stat)
    opt = chainer.optimizers.Adam(alpha=1e-3, beta1=0.9, beta2=0.99)
    opt.setup(m)
    for name, param in m.namedparams():
        if param.ndim >= 2:
            # nanoGPT decays the matrices only, by lr·0.1 per step (AdamW);
            # Chainer's Adam subtracts weight_decay_rate·W itself (eta 1)
            param.update_rule.hyperparam.weight_decay_rate = 1e-3 * 0.1
    rng = numpy.random.RandomState(args.seed + 1)
    loss = None
    for _ in range(args.train_steps):
        x, t = _windows(ids, rng, args.batch, args.block)
        m.cleargrads()
        loss = lm_loss(m(x), t)
        loss.backward()
        opt.update()
    return {n: p.array.copy() for n, p in m.namedparams()}, float(
        loss.array)


def _model(args, trained, shape):
    """The GPT probed: ``args``' shape and precision, the ``trained``
    parameters ({path: array}) if given, else an initialization of
    ``args.seed``."""
    numpy.random.seed(args.seed)
    with dtype_config(args.precision):
        m = GPT(args.vocab, block_size=args.block,
                attention_stat=args.attention_stat, **shape)
    if trained is not None:
        for name, param in m.namedparams():
            param.array[...] = trained[name]
    apply_precision(m, args.precision, args.seed)
    return m


def _run_state(args):
    """(parameters, GPT keyword arguments, the first ``val`` batch, a
    description) of the end of the GPT-table run in ``args.run``; sets
    ``args``' precision, vocabulary, block, batch and attention statistic
    to the run's."""
    import yaml
    from ada_loss.datasets.kjv import get_kjv
    from ada_loss.experiment import runinfo
    from ada_loss.training.safe_npz import open_npz
    with open(os.path.join(args.run, 'config.yaml'), encoding='utf-8') as f:
        cfg = yaml.safe_load(f)
    info = runinfo.read_run(args.run)
    if not info or info.get('status') != runinfo.FINISHED:
        raise SystemExit('{}: a finished run was expected (run.json status '
                         '{!r})'.format(args.run, (info or {}).get('status')))
    model = cfg['model']
    args.precision = cfg['run']['precision']
    args.seed = cfg['run']['seed']      # NVFP4's stochastic rounding, as the run
    args.block = model['block_size']
    args.batch = cfg['train']['batchsize']
    args.attention_stat = model['attention_stat']
    corpus = get_kjv(cfg['data'].get('kjv_root'), make=False)
    if corpus.sha256 != info.get('corpus_sha256'):
        raise SystemExit('{}: the run trained on a corpus of SHA-256 {}, the '
                         'one found is {}'.format(args.run,
                                                  info.get('corpus_sha256'),
                                                  corpus.sha256))
    args.vocab = corpus.vocab_size
    snap = os.path.join(args.run, 'snapshot_latest')
    prefix = 'updater/model:main/predictor/'
    with open_npz(snap) as z:       # no pickles
        done = int(z['updater/iterator:main/iteration'])
        trained = {'/' + k[len(prefix):]: z[k] for k in z.files
                   if k.startswith(prefix)}
    if done != info.get('iterations'):
        raise SystemExit('{}: the snapshot holds iteration {}, the run ended '
                         'at {}'.format(snap, done, info.get('iterations')))
    shape = {k: model[k] for k in ('n_layer', 'n_head', 'n_embd',
                                   'tie_weights', 'attention_format', 'bias')}
    first = corpus.eval_batches('val', args.block, args.batch,
                                cfg['data']['eval_iters'])[0]
    state = 'end of {} ({} {}, seed {}, iteration {}, val loss {:.4f}), ' \
        'first val batch'.format(os.path.basename(os.path.normpath(args.run)),
                                 args.precision, cfg['run']['mode'],
                                 cfg['run']['seed'], done,
                                 info['final_val_loss'])
    return trained, shape, first, state


def _parser():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--precision', default='fp8_e4m3')
    p.add_argument('--modes', nargs='+', default=[
        'fixed:1', 'adaptive', 'adaptive:init_scale=amax',
        'adaptive:init_scale=auto'])
    p.add_argument('--batch', type=int, default=12)
    p.add_argument('--block', type=int, default=64)
    p.add_argument('--vocab', type=int, default=65)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--text', metavar='FILE',
                   help='probe at a trained state: a text file whose '
                        'characters the model is trained on first (e.g. '
                        'the KJV: bible -f Gen1:1-Rev22:21 > kjv.txt)')
    p.add_argument('--train-steps', type=int, default=200,
                   help='FP32 training steps before probing, with --text')
    p.add_argument('--trained-cache', metavar='NPZ',
                   help='with --text: load the trained parameters from '
                        'this file if it exists, else save them there')
    p.add_argument('--run', metavar='RUN_FOLDER',
                   help='probe at the end of a GPT-table run: its '
                        'snapshot, shape, corpus and precision')
    p.add_argument('--attention-stat', default='tensor',
                   choices=('tensor', 'head'))
    p.add_argument('--list', action='store_true',
                   help='also list every GEMM above 0.1 %%')
    p.add_argument('--detail', metavar='PREFIX',
                   help='also print the probe row (α, β, which bound set '
                        'β, uf_in, headroom in and out in binades) of every '
                        'GEMM whose name starts with PREFIX')
    return p


def main(argv=None):
    args = _parser().parse_args(argv)
    trained = None
    state = 'initialization'
    shape = {}
    if args.run is not None:
        if args.text is not None:
            raise SystemExit('--run and --text exclude each other')
        trained, shape, (x_val, t_val), state = _run_state(args)
    elif args.text is not None:
        with open(args.text, encoding='utf-8') as f:
            text = f.read()
        chars = sorted(set(text))
        args.vocab = len(chars)
        lut = {c: i for i, c in enumerate(chars)}
        ids = numpy.array([lut[c] for c in text], numpy.int32)
        cache = args.trained_cache
        if cache is not None and os.path.exists(cache):
            with numpy.load(cache) as f:
                trained = {k: f[k] for k in f.files if k != '(loss)'}
                last = float(f['(loss)'])
        else:
            trained, last = _train_fp32(args, ids, args.vocab)
            if cache is not None:
                numpy.savez(cache, **dict(trained, **{'(loss)': last}))
        state = 'after {} FP32 steps on {} (last training loss {:.3f})'.format(
            args.train_steps, os.path.basename(args.text), last)
    print('{}, GPT {}x{}x{} block {}, batch {}, vocab {}, attention_stat {}'
          ', {}'.format(args.precision, shape.get('n_layer', 4),
                        shape.get('n_head', 4), shape.get('n_embd', 128),
                        args.block, args.batch, args.vocab,
                        args.attention_stat, state))
    print('{:<28} {:>9} {:<24} {:>9} {:>9} {:>8}'.format(
        'mode', 'max uf_in', 'at', 'lm_head', 'attention', '<=0.1%'))
    for mode in args.modes:
        m = _model(args, trained, shape)
        bound = 'output' if mode.startswith('adaptive') else None
        scaling = ProbingLossScaling(make_loss_scaling(mode, args.precision),
                                     mode, every=1, bound=bound)
        scaling.bind(m)
        rng = numpy.random.RandomState(args.seed)
        if args.run is not None:
            x, t = x_val, t_val
        elif trained is None:
            x = rng.randint(0, args.vocab, (args.batch, args.block)).astype(
                numpy.int32)
            t = numpy.roll(x, -1, axis=1)
        else:
            # a stream of its own (the training windows used seed + 1)
            x, t = _windows(ids, numpy.random.RandomState(args.seed + 2),
                            args.batch, args.block)
        for _ in range(2):
            scaling.records = []
            m.cleargrads()
            with dtype_config(args.precision):
                scaling.backward(lm_loss(m(x), t))
        rows = {r['layer']: r['uf_in'] for r in scaling.records}
        details = [r for r in scaling.records if args.detail is not None
                   and r['layer'].startswith(args.detail)]
        seen = {k: v for k, v in rows.items() if v == v}    # not NaN
        if not seen:
            # e.g. a recipe with grad=loss: its GEMMs keep FP32 gradients
            print('{:<28} no GEMM rounds the gradient entering it in {}'
                  .format(mode, args.precision), flush=True)
            continue
        worst = max(seen, key=lambda k: seen[k])
        attn = [v for k, v in seen.items() if k.endswith((':a', ':b'))]
        ok = sum(v <= 1e-3 for v in seen.values())

        def pct(v):
            return '-' if v is None or v != v else '{:.2%}'.format(v)
        print('{:<28} {:>9} {:<24} {:>9} {:>9} {:>4}/{}'.format(
            mode, pct(seen[worst]), worst, pct(rows['lm_head']),
            pct(max(attn) if attn else None), ok, len(rows)), flush=True)
        floors = {r['layer']: r.get('uf_floor') for r in scaling.records}
        mass = {r['layer']: r.get('uf_mass_in') for r in scaling.records}
        if args.list:
            # floor: the least share one scale of the tensor could flush;
            # mass: the flushed entries' share of the gradient's L1 norm
            print('    above 0.1 %: ' + ', '.join(
                '{} {} (floor {}, mass {})'.format(
                    k, pct(v), pct(floors[k]),
                    '{:.2g}%'.format(100 * mass[k]))
                for k, v in seen.items() if v > 1e-3))
            empty = [k for k in rows if k not in seen]
            if empty:
                print('    no nonzero entry entering: ' + ', '.join(empty))
        for r in details:
            print('    {:<24} alpha 2^{:<4g} beta 2^{:<3g} set_by {:<5} uf_in '
                  '{:6.2%} (floor {:6.2%}, mass {:.1e}) headroom in {:5.2f} '
                  'out {:5.2f} err_x {:.2e}'.format(
                      r['layer'], numpy.log2(r['alpha']),
                      numpy.log2(r['beta']), r['set_by'] or '-',
                      r['uf_in'], r['uf_floor'], r['uf_mass_in'],
                      r['headroom_in_log2'],
                      r['headroom_log2'], r['err_x']))


if __name__ == '__main__':
    main()
