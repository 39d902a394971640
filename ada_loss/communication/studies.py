"""The APS measurements (seed 004) as experiments: configs, runs, tables.

* :func:`table4_main` — Table 4 analogue (§4.1): test accuracy with FP32 vs
  (5, 2), (4, 3), (3, 0) gradient communication, with and without APS,
  N simulated workers (ring all-reduce), a large global batch; mean ± std
  over seeds, diverged runs counted. ``experiments/aps_table4.py``.
* :func:`table9_main` — Table 9 analogue (§4.2): Eq. 5's average relative
  round-off error of one layer's gradient reduced over N = 256 workers,
  ring vs hierarchical groups of k, with and without Kahan (§5.1.1).
  ``experiments/aps_table9.py``.
* :func:`cost_main` — bytes per worker and all-reduce steps from a model's
  parameter shapes (§3.3.3, §4.2). ``experiments/aps_cost.py``.

Each study has a schema (:data:`TABLE4_SCHEMA`, ...) checked by the
project's config system (:mod:`ada_loss.experiment.config`: YAML file,
``--set key=value``, ``--help-config``; a bad key or value raises
``ConfigError`` before anything runs). Worker counts, group sizes and batch
sizes are checked against each other at load time as well.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy

from ada_loss.communication.policy import CommPolicy
from ada_loss.communication.summation import ORDERS
from ada_loss.experiment import config as C
from ada_loss.formats import get_format


# -- config fields --------------------------------------------------------------
def _format_field(default, doc):
    def check(value, key):
        if not isinstance(value, str):
            C._fail(key, 'a format name', value)
        try:
            return get_format(value).name
        except ValueError as e:
            raise C.ConfigError(key, str(e))
    return C.Field(default, check, 'a format name (float32, e5m2, e4m3, '
                   'e3m0, fp8_e4m3, ... any e<E>m<M>)', doc)


def _policy_section(workers):
    return {
        'workers': C.integer(workers, 'N, the number of simulated data-'
                             'parallel workers', minimum=1),
        'order': C.string('ring', 'all-reduce order: ring (§4.1) or '
                          'hierarchical (§4.2, needs group_size)',
                          choices=ORDERS),
        'group_size': C.integer(None, 'k of the hierarchical all-reduce '
                                '(workers % k == 0)', minimum=1,
                                optional=True),
        'kahan': C.boolean(False, 'Kahan summation in the low precision '
                           '(§5.1.1)'),
        'fp32_layers': C.list_of(C.string(None, ''), [], 'parameters kept '
                                 'in FP32 (fnmatch patterns, e.g. '
                                 '"*/fc/*": Table 7)', nonempty=False),
        'fp32_epochs': C.number(0, 'hybrid schedule: FP32 communication '
                                'for the first E epochs (Table 6)',
                                minimum=0.0),
    }


_DATA = {
    'dataset': C.string('digits', 'digits (sklearn, 16x16) or fashion_mnist '
                        '(if its files exist); cifar10 when given',
                        choices=('digits', 'fashion_mnist', 'cifar10')),
    'digits_size': C.integer(16, 'side of the upsampled digits', minimum=8),
    'fashion_mnist_root': C.string('/usr/share/datasets/fashion-mnist',
                                   'folder of the Fashion-MNIST IDX files'),
    'cifar_root': C.string(None, 'CIFAR files (null: $ADA_LOSS_CIFAR_ROOT)',
                           optional=True),
    'train_size': C.integer(None, 'random training subset', minimum=1,
                            optional=True),
    'test_size': C.integer(None, 'random test subset', minimum=1,
                           optional=True),
    'split_seed': C.integer(0, 'seed of the digits split and subsets',
                            minimum=0),
    'augment': C.boolean(False, 'CIFAR only: pad-4 random crop and flip'),
}

_MODEL = {
    'name': C._model_field('small_cnn', 'model (resnet8/20/..., small_cnn, '
                           'plain_cnn, ...)'),
    'width': C.integer(None, 'width (null: the model default)', minimum=1,
                       optional=True),
}

TABLE4_SCHEMA = {
    'table': C.string('aps_table4', 'results subfolder: <out>/<table>/'),
    'description': C.string('', 'free text'),
    'grid': {
        'formats': C.list_of(_format_field(None, ''), ['float32', 'e5m2',
                                                       'e4m3', 'e3m0'],
                             'gradient formats; float32 = the baseline'),
        'aps': C.list_of(C.boolean(None, ''), [True, False],
                         'with / without APS (ignored for float32)'),
        'seeds': C.list_of(C.integer(None, '', minimum=0), [0, 1],
                           'seeds (model init and data order)'),
    },
    'sim': _policy_section(8),
    'model': _MODEL,
    'data': _DATA,
    'train': {
        'mode': C._mode_field('fp32', 'loss-scaling mode (gradients arrive '
                              'scaled; fp32 = no scaling)'),
        'precision': C._precision_field(None, 'compute precision (null: '
                                        'float32 for fp32, mixed16 else)'),
        'batchsize': C.integer(256, 'global batch (workers x per-worker)',
                               minimum=1),
        'epochs': C.number(12, 'epochs', positive=True),
        'lr': C.number(0.2, 'learning rate', positive=True),
        'warmup_epochs': C.number(1, 'linear lr warm-up from lr/10 (large '
                                  'batch, Goyal et al.)', minimum=0.0),
        'lr_steps': C.list_of(C.number(None, '', positive=True), [8, 11],
                              'epochs where lr *= lr_decay',
                              nonempty=False),
        'lr_decay': C.number(0.1, 'lr multiplier', positive=True),
        'momentum': C.number(0.9, 'MomentumSGD momentum', minimum=0.0),
        'weight_decay': C.number(1e-4, 'weight decay', minimum=0.0),
        'eval_batchsize': C.integer(512, 'evaluation batch', minimum=1),
    },
}

TABLE9_SCHEMA = {
    'table': C.string('aps_table9', 'results subfolder'),
    'description': C.string('', 'free text'),
    'formats': C.list_of(_format_field(None, ''), ['e5m2'],
                         'formats (the paper: (5, 2))'),
    'aps': C.boolean(True, 'APS shift before the cast'),
    'workers': C.integer(256, 'N', minimum=1),
    'group_sizes': C.list_of(C.integer(None, '', minimum=1),
                             [4, 8, 16, 32, 64], 'hierarchical group sizes '
                             '(the ring is always included)'),
    'kahan': C.list_of(C.boolean(None, ''), [False, True],
                       'without / with Kahan summation'),
    'seeds': C.list_of(C.integer(None, '', minimum=0), [0, 1, 2],
                       'seeds (model init and batch)'),
    'layer': C.string(None, 'parameter whose gradient is reduced (null: the '
                      'first GEMM weight, e.g. /predictor/conv1/W)',
                      optional=True),
    'per_worker_batch': C.integer(4, 'examples per worker', minimum=1),
    'model': dict(_MODEL, name=C._model_field('resnet20', 'model')),
    'data': _DATA,
}

COST_SCHEMA = {
    'model': dict(_MODEL, name=C._model_field('resnet20', 'model')),
    'num_classes': C.integer(10, 'classes of the model', minimum=2),
    'in_channels': C.integer(3, 'input channels', minimum=1),
    'formats': C.list_of(_format_field(None, ''),
                         ['float32', 'float16', 'e5m2', 'e4m3', 'e3m0'],
                         'formats'),
    'workers': C.list_of(C.integer(None, '', minimum=2), [8, 256],
                         'worker counts p'),
    'group_sizes': C.list_of(C.integer(None, '', minimum=2), [16],
                             'hierarchical group sizes k'),
    'fp32_layers': C.list_of(C.string(None, ''), [], 'parameters kept in '
                             'FP32 (fnmatch patterns)', nonempty=False),
}


def describe(schema, prefix=''):
    """``key: expected (default) -- doc`` lines of a schema."""
    lines = []
    for key, spec in schema.items():
        if isinstance(spec, dict):
            lines.extend(describe(spec, prefix + key + '.'))
        else:
            lines.append('{}{}: {} (default {!r}) -- {}'.format(
                prefix, key, spec.expected, spec.default, spec.doc))
    return lines


def load(schema, path, overrides, check=None):
    """Reads, overrides and validates; ``check(cfg)`` adds cross-key checks
    (raising ConfigError)."""
    raw = C.read_yaml(path) if path else {}
    cfg = C.validate_schema(schema, C.apply_overrides(raw, overrides))
    if check is not None:
        check(cfg)
    return cfg


def _policy_error(key, fn):
    try:
        return fn()
    except ValueError as e:
        raise C.ConfigError(key, str(e))


def sim_policy(sim, fmt, aps):
    return CommPolicy(fmt, aps, sim['order'], sim['group_size'], sim['kahan'],
                      sim['fp32_layers'], sim['fp32_epochs'])


def check_table4(cfg):
    sim, train = cfg['sim'], cfg['train']
    _policy_error('sim.group_size', lambda: sim_policy(sim, 'e5m2', True)
                  .check(sim['workers']))
    if train['batchsize'] % sim['workers']:
        raise C.ConfigError('train.batchsize', 'global batch {} cannot be '
                            'split into {} equal shards (sim.workers); use a '
                            'multiple of it'.format(train['batchsize'],
                                                    sim['workers']))
    from ada_loss.scaling import make_loss_scaling, resolve_precision
    _policy_error('train.mode', lambda: make_loss_scaling(
        train['mode'], resolve_precision(train['mode'], train['precision'])))


def check_table9(cfg):
    for i, k in enumerate(cfg['group_sizes']):
        _policy_error('group_sizes[{}]'.format(i), lambda: CommPolicy(
            'e5m2', order='hierarchical', group_size=k).check(cfg['workers']))


def parser(description, default_config, runs=True):
    p = argparse.ArgumentParser(description=description)
    p.add_argument('--config', default=default_config,
                   help='YAML config (default: %(default)s)')
    p.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                   help='override a config key (value parsed as YAML)')
    p.add_argument('--help-config', action='store_true',
                   help='print the config schema and exit')
    p.add_argument('--out', default='results', help='results root')
    if runs:
        p.add_argument('--force', action='store_true',
                       help='rerun cells whose result exists')
    return p


def _start(argv, schema, description, default_config, check=None,
           runs=True):
    args = parser(description, default_config, runs).parse_args(argv)
    if args.help_config:
        print('\n'.join(describe(schema)))
        return args, None
    try:
        cfg = load(schema, args.config, args.set, check)
    except C.ConfigError as e:
        print('error: {}'.format(e), file=sys.stderr)
        return args, 2
    return args, cfg


# -- data and models ------------------------------------------------------------
def load_data(data_cfg):
    from ada_loss.experiment.data import dataset_info, load_datasets
    d = dict(data_cfg)
    name = d.pop('dataset')
    train, test = load_datasets(name, d)
    return train, test, dataset_info(name)


def make_model(model_cfg, info, precision, seed):
    from ada_loss.experiment.models import build
    from ada_loss.training import Classifier, dtype_config
    numpy.random.seed(seed)
    with dtype_config(precision):
        return Classifier(build(model_cfg['name'], info[0], info[1],
                                model_cfg['width']), precision)


# -- Table 4 ----------------------------------------------------------------------
def table4_cells(cfg):
    cells = []
    for fmt in cfg['grid']['formats']:
        for aps in ([True] if get_format(fmt).is_float32
                    else cfg['grid']['aps']):
            for seed in cfg['grid']['seeds']:
                cells.append((fmt, aps, seed))
    return cells


def cell_name(fmt, aps, seed):
    return '{}-{}-s{}'.format(fmt, 'aps' if aps else 'noaps', seed)


def _lr_at(train, epoch):
    lr = train['lr'] * train['lr_decay'] ** sum(
        1 for s in train['lr_steps'] if epoch >= s)
    w = train['warmup_epochs']
    if w > 0 and epoch < w:
        lr *= 0.1 + 0.9 * epoch / w
    return lr


def evaluate(model, test, batchsize):
    import chainer
    correct = 0
    with chainer.using_config('train', False), \
            chainer.using_config('enable_backprop', False):
        for i in range(0, len(test), batchsize):
            x, t = chainer.dataset.concat_examples(
                [test[j] for j in range(i, min(i + batchsize, len(test)))])
            y = model.predictor(x.astype(model._xdtype))
            correct += int((y.array.argmax(axis=1) == t).sum())
    return correct / len(test)


def run_table4_cell(cfg, cell, data):
    """Trains one (format, APS, seed) with the N-worker simulator; returns
    the result dict (accuracy, diverged, steps, time)."""
    import chainer
    from ada_loss.communication.simulator import SimulatedDataParallelUpdater
    from ada_loss.experiment.run import build_optimizer
    from ada_loss.scaling import make_loss_scaling, resolve_precision
    from ada_loss.scaling.methods import NonFiniteGradientError
    fmt, aps, seed = cell
    train_cfg, sim = cfg['train'], cfg['sim']
    train, test, info = data
    precision = resolve_precision(train_cfg['mode'], train_cfg['precision'])
    model = make_model(cfg['model'], info, precision, seed)
    opt = build_optimizer(model, precision, train_cfg)
    numpy.random.seed(seed)
    it = chainer.iterators.SerialIterator(train, train_cfg['batchsize'],
                                          shuffle=True)
    scaling = make_loss_scaling(train_cfg['mode'], precision)
    if hasattr(scaling, 'bind'):
        scaling.bind = (lambda m, f=scaling.bind: f(m, verbose=False)) \
            if train_cfg['mode'].startswith('adaptive') else scaling.bind
    up = SimulatedDataParallelUpdater(it, opt, scaling, sim['workers'],
                                      sim_policy(sim, fmt, aps),
                                      mode=train_cfg['mode'])
    t0 = time.time()
    diverged, losses = None, []
    while it.epoch_detail < train_cfg['epochs']:
        opt.lr = _lr_at(train_cfg, it.epoch_detail)
        try:
            with numpy.errstate(all='ignore'):
                up.update()
        except NonFiniteGradientError as e:     # modes that cannot skip
            diverged = str(e).split('. ')[0]
            break
        losses.append(up.last_loss)
        if not math.isfinite(up.last_loss) or not all(
                bool(numpy.isfinite(p.array).all()) for p in model.params()):
            diverged = 'non-finite loss or weights at iteration {}'.format(
                up.iteration)
            break
    acc = None if diverged else evaluate(model, test,
                                         train_cfg['eval_batchsize'])
    return {'format': fmt, 'aps': aps, 'seed': seed,
            'workers': sim['workers'], 'policy': sim_policy(
                sim, fmt, aps).describe(),
            'test_accuracy': acc, 'diverged': diverged,
            'iterations': up.iteration, 'skipped_steps': up.skipped_steps,
            'final_train_loss': losses[-1] if losses else None,
            'seconds': time.time() - t0}


def _mean_std(values):
    if not values:
        return '—'
    m = numpy.mean(values) * 100
    if len(values) == 1:
        return '{:.2f}'.format(m)
    return '{:.2f} ± {:.2f}'.format(m, numpy.std(values, ddof=1) * 100)


def table4_markdown(cfg, results):
    sim = cfg['sim']
    lines = ['**APS Table 4 analogue: test accuracy (%), {} simulated '
             'workers ({}), global batch {}, {}, {}, loss scaling {}**'
             .format(sim['workers'], sim_policy(sim, 'float32', True)
                     .describe().split(', ', 2)[-1],
                     cfg['train']['batchsize'], cfg['model']['name'],
                     cfg['data']['dataset'], cfg['train']['mode']), '',
             '| Precision (exp, man) | APS | accuracy | diverged |',
             '|---|---|---|---|']
    for fmt in cfg['grid']['formats']:
        f = get_format(fmt)
        for aps in ([True] if f.is_float32 else cfg['grid']['aps']):
            rs = [r for r in results if r['format'] == f.name
                  and r['aps'] == aps]
            accs = [r['test_accuracy'] for r in rs if not r['diverged']]
            div = sum(1 for r in rs if r['diverged'])
            label = '({}, {}): {} bits'.format(f.exp_bits, f.man_bits,
                                               1 + f.exp_bits + f.man_bits)
            lines.append('| {} | {} | {} | {} |'.format(
                label, '/' if f.is_float32 else ('yes' if aps else 'no'),
                _mean_std(accs), '{}/{}'.format(div, len(rs))))
    lines.append('')
    lines.append('mean ± sample std over seeds {} of the runs that did not '
                 'diverge; "diverged" = runs with non-finite loss or '
                 'weights / runs.'.format(cfg['grid']['seeds']))
    return '\n'.join(lines)


def table4_main(argv=None, default_config='configs/aps_table4.yaml'):
    args, cfg = _start(argv, TABLE4_SCHEMA, 'APS Table 4 analogue',
                       default_config, check_table4)
    if not isinstance(cfg, dict):
        return cfg or 0
    try:
        data = load_data(cfg['data'])
    except (OSError, ValueError) as e:
        print('error: {}'.format(e), file=sys.stderr)
        return 2
    folder = os.path.join(args.out, cfg['table'])
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, 'config.yaml'), 'w') as f:
        f.write(C.dump_config(cfg))
    results = []
    for cell in table4_cells(cfg):
        path = os.path.join(folder, cell_name(*cell) + '.json')
        if os.path.exists(path) and not args.force:
            with open(path) as f:
                results.append(json.load(f))
            continue
        r = run_table4_cell(cfg, cell, data)
        with open(path, 'w') as f:
            json.dump(r, f, indent=1)
        print('{:24s} acc {} {} ({:.0f} s)'.format(
            cell_name(*cell), r['test_accuracy'], r['diverged'] or '',
            r['seconds']), flush=True)
        results.append(r)
    md = table4_markdown(cfg, results)
    with open(os.path.join(folder, 'table.md'), 'w') as f:
        f.write(md + '\n')
    print(md)
    return 0


# -- Table 9 ------------------------------------------------------------------------
def worker_gradients(cfg, seed, data):
    """The chosen layer's FP32 gradient on each of N workers (shard r of a
    random global batch of N × per_worker_batch examples)."""
    import chainer
    train, _, info = data
    n, b = cfg['workers'], cfg['per_worker_batch']
    if n * b > len(train):
        raise ValueError('workers x per_worker_batch = {} exceeds the {} '
                         'training examples'.format(n * b, len(train)))
    model = make_model(cfg['model'], info, 'float32', seed)
    names = [name for name, p in model.namedparams()]
    layer = cfg['layer']
    if layer is None:
        layer = next(name for name, p in sorted(model.namedparams())
                     if p.array.ndim >= 2 and 'conv1/W' in name)
    if layer not in names:
        raise ValueError('no parameter {!r}; the model has: {}'.format(
            layer, ', '.join(sorted(names))))
    param = dict(model.namedparams())[layer]
    order = numpy.random.RandomState(seed).permutation(len(train))[:n * b]
    grads = []
    for r in range(n):
        x, t = chainer.dataset.concat_examples(
            [train[int(i)] for i in order[r * b:(r + 1) * b]])
        model.cleargrads()
        model(x, t).backward()
        grads.append(param.grad.astype(numpy.float32).copy())
    return layer, grads


def table9_main(argv=None, default_config='configs/aps_table9.yaml'):
    from ada_loss.communication.allreduce import allreduce_low_precision
    from ada_loss.communication.roundoff import (
        average_round_off_error, exact_mean)
    args, cfg = _start(argv, TABLE9_SCHEMA, 'APS Table 9 analogue',
                       default_config, check_table9, runs=False)
    if not isinstance(cfg, dict):
        return cfg or 0
    try:
        data = load_data(cfg['data'])
    except (OSError, ValueError) as e:
        print('error: {}'.format(e), file=sys.stderr)
        return 2
    n = cfg['workers']
    columns = [('hierarchical', k) for k in cfg['group_sizes']] + \
        [('ring', None)]
    errors = {}
    layer = None
    for seed in cfg['seeds']:
        try:
            layer, grads = worker_gradients(cfg, seed, data)
        except ValueError as e:
            print('error: {}'.format(e), file=sys.stderr)
            return 2
        exact = exact_mean(grads)
        for fmt in cfg['formats']:
            for kahan in cfg['kahan']:
                for order, k in columns:
                    low = allreduce_low_precision(grads, fmt, cfg['aps'],
                                                  order, k, kahan)
                    errors.setdefault((fmt, kahan, k), []).append(
                        average_round_off_error(exact, low))
    head = ['{}'.format(k) for _, k in columns[:-1]] + \
        ['{} (ring)'.format(n)]
    lines = ['**APS Table 9 analogue: average round-off error (Eq. 5, %) '
             'of {} ({} gradient, shape {}) over {} workers, {} APS, '
             '{} examples per worker**'.format(
                 layer, cfg['model']['name'], grads[0].shape, n,
                 'with' if cfg['aps'] else 'without',
                 cfg['per_worker_batch']), '',
             '| format | summation | group size: ' + ' | '.join(head) + ' |',
             '|---|---|' + '---|' * len(head)]
    for fmt in cfg['formats']:
        f = get_format(fmt)
        for kahan in cfg['kahan']:
            cells = [_mean_std(errors[(fmt, kahan, k)]) for _, k in columns]
            lines.append('| ({}, {}) | {} | {} |'.format(
                f.exp_bits, f.man_bits, 'Kahan' if kahan else 'naive',
                ' | '.join(cells)))
    lines += ['', 'mean ± sample std over seeds {} (model init and batch); '
              'elements with an exact zero mean left out of Eq. 5.'.format(
                  cfg['seeds'])]
    md = '\n'.join(lines)
    folder = os.path.join(args.out, cfg['table'])
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, 'table.md'), 'w') as f:
        f.write(md + '\n')
    with open(os.path.join(folder, 'errors.json'), 'w') as f:
        json.dump([{'format': k[0], 'kahan': k[1], 'group_size': k[2],
                    'errors': v} for k, v in errors.items()], f, indent=1)
    print(md)
    return 0


# -- communication cost ----------------------------------------------------------
def cost_main(argv=None, default_config='configs/aps_cost.yaml'):
    from ada_loss.communication.cost import cost_rows
    from ada_loss.experiment.models import build
    args, cfg = _start(argv, COST_SCHEMA, 'APS communication cost',
                       default_config, runs=False)
    if not isinstance(cfg, dict):
        return cfg or 0
    model = build(cfg['model']['name'], cfg['num_classes'],
                  cfg['in_channels'], cfg['model']['width'])
    named = sorted(model.namedparams())
    sizes = [p.array.size for _, p in named]
    pol = CommPolicy('float32', fp32_layers=cfg['fp32_layers'])
    mask = [pol.is_fp32_layer(n) for n, _ in named]
    rows = cost_rows(sizes, cfg['formats'], cfg['workers'],
                     cfg['group_sizes'], mask)
    base = {r['p']: r['message_bytes'] for r in rows
            if r['format'] == 'float32'}
    ks = [k for k in cfg['group_sizes']]
    lines = ['**Communication per step: {} ({} parameters in {} tensors)'
             '**'.format(cfg['model']['name'], sum(sizes), len(sizes)), '',
             '| format | bits | APS | p | exponents [B] | payload [B] | '
             'message [KiB] | vs FP32 | ring: sent per worker [KiB] | '
             'ring steps 2(p−1) | ' + ' | '.join(
                 'hier. k={} steps 4(k−1)+2(p/k−1)'.format(k) for k in ks)
             + ' |', '|' + '---|' * (10 + len(ks))]
    for r in rows:
        lines.append('| {} | {} | {} | {} | {} | {:.0f} | {:.1f} | {:.3f} | '
                     '{:.1f} | {} | {} |'.format(
                         r['format'], r['bits'], 'yes' if r['aps'] else 'no',
                         r['p'], r['exponent_bytes'], r['payload_bytes'],
                         r['message_bytes'] / 1024.0,
                         r['message_bytes'] / base.get(r['p'], float('nan')),
                         r['ring_sent_bytes'] / 1024.0, r['ring_steps'],
                         ' | '.join(str(r.get('steps_k{}'.format(k), '—'))
                                    for k in ks)))
    md = '\n'.join(lines)
    print(md)
    return 0
