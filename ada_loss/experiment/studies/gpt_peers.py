"""Peer rows of the GPT table: the runs of the independent PyTorch peer
(``scripts/gpt_torch_peer.py``, issue 48 item 5: plain PyTorch FP32 and
Graphcore's ``unit-scaling`` with ``simulate_fp8``) read from the one JSON
file each run writes, checked before they are pooled (issue 47, item 3:
"tables that prove what they pool").

The config's ``peers`` is a list of ``{label, files}``: ``files`` are paths
or globs, relative to the repository root or absolute; a path that is
missing or a glob that matches nothing is refused, naming it. Each file
becomes one run of the row (by its ``seed``), and the table refuses
(:class:`~ada_loss.experiment.runner.TableRefused`, naming the file and the
key) a file

* of another model shape or length -- ``config.n_layer``, ``n_head``,
  ``n_embd``, ``block_size``, ``bias``, ``batch_size``, ``max_iters``
  against ``model.*``, ``train.batchsize``, ``train.max_iterations`` --,
  or other evaluation batches (``eval_iters`` against ``data.eval_iters``,
  ``eval_seed`` against :data:`ada_loss.datasets.char_corpus.EVAL_SEED`):
  its loss would not be a loss of this table's model on this table's
  batches;
* of another text: ``corpus.sha256`` unlike the ``corpus_sha256`` of any
  run of the table (``run.json``);
* that ended neither finished (``final.step`` = ``max_iters``, a finite
  ``final.val``) nor diverged (``diverged_at`` set);
* whose seed another file of the row already has, or whose precision or
  optimizer settings differ from the row's first file's (a row pools one
  configuration over seeds).

The optimizer settings (:data:`SETTINGS`: learning rate, its floor,
warm-up, weight decay, Adam's betas) may differ from the table's -- the
unit-scaling peer trains at 2^-6, as Graphcore's notebook does -- and are
shown instead: the learning rate in the row's label, every differing
setting in a footnote.
"""
import glob
import json
import math
import os

from ada_loss.datasets import char_corpus
from ada_loss.experiment import config as C
from ada_loss.experiment import runinfo as R
from ada_loss.experiment.runner import TableRefused

#: the repository root, against which a relative path of ``files`` is read
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))))

#: (the peer's ``config`` key, the table's config key): refused when unequal
SHAPE = (('n_layer', 'model.n_layer'), ('n_head', 'model.n_head'),
         ('n_embd', 'model.n_embd'), ('block_size', 'model.block_size'),
         ('bias', 'model.bias'), ('batch_size', 'train.batchsize'),
         ('max_iters', 'train.max_iterations'),
         ('eval_iters', 'data.eval_iters'))

#: (the peer's ``config`` key, the table's config key): shown when unequal
SETTINGS = (('lr', 'train.lr'), ('min_lr', 'train.min_lr'),
            ('warmup_iters', 'train.warmup_iterations'),
            ('weight_decay', 'train.weight_decay'),
            ('beta1', 'train.beta1'), ('beta2', 'train.beta2'))


class Peers(object):
    """``peers``: a list of ``{label: text, files: [path or glob, ...]}``."""
    expected = ('a list of mappings {label: text, files: [paths or globs, '
                'relative to the repository root or absolute]}')

    @staticmethod
    def parse(value, key):
        if not isinstance(value, list):
            C.fail(key, Peers.expected, value)
        out, labels = [], set()
        for i, peer in enumerate(value):
            pkey = '{}[{}]'.format(key, i)
            if not isinstance(peer, dict) or set(peer) != {'label', 'files'} \
                    or not isinstance(peer['label'], str) \
                    or not peer['label'] \
                    or not isinstance(peer['files'], list) \
                    or not peer['files'] or not all(
                        isinstance(f, str) and f for f in peer['files']):
                C.fail(pkey, Peers.expected, peer)
            if peer['label'] in labels:
                raise C.ConfigError(pkey + '.label', 'the label {!r} is '
                                    'given twice'.format(peer['label']))
            labels.add(peer['label'])
            out.append({'label': peer['label'], 'files': list(peer['files'])})
        return out


def _table_value(cfg, dotted):
    value = cfg
    for name in dotted.split('.'):
        value = getattr(value, name)
    return value


def _same(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    return a == b


def shown(path):
    """``path`` relative to the repository root where it lies inside it."""
    rel = os.path.relpath(path, REPO_ROOT)
    return path if rel.startswith(os.pardir) else rel


def resolve(pattern, key):
    """The files of one entry of ``files``, sorted: a glob's matches (none
    is refused) or the one path (missing is refused)."""
    path = pattern if os.path.isabs(pattern) else os.path.join(REPO_ROOT,
                                                               pattern)
    if glob.has_magic(pattern):
        found = sorted(p for p in glob.glob(path) if os.path.isfile(p))
        if not found:
            raise TableRefused('{}: {!r} matches no file (looked for {})'
                               .format(key, pattern, path))
        return found
    if not os.path.isfile(path):
        raise TableRefused('{}: the peer file {} is missing'.format(key,
                                                                    path))
    return [path]


def _refuse(path, text):
    raise TableRefused('peer file {}: {}'.format(shown(path), text))


def read(path):
    """The JSON record of one peer run."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError) as e:
        _refuse(path, 'not readable as JSON ({})'.format(e))
    if not isinstance(record, dict) or not isinstance(
            record.get('config'), dict):
        _refuse(path, 'no "config" mapping (not written by '
                'scripts/gpt_torch_peer.py?)')
    return record


def peer_run(record, path, cfg):
    """One peer file as a run of the table (the keys of a ``run.json`` the
    table reads: ``status``, ``final_val_loss``, ``final_select_loss``,
    ``corpus_sha256``), after the checks of :data:`SHAPE`, the evaluation
    seed and the ending; ``settings`` holds its :data:`SETTINGS`."""
    conf = record['config']
    for peer_key, table_key in SHAPE:
        if peer_key not in conf:
            _refuse(path, 'config.{} is missing (the table\'s {} is {!r})'
                    .format(peer_key, table_key,
                            _table_value(cfg, table_key)))
        ours = _table_value(cfg, table_key)
        if not _same(conf[peer_key], ours):
            _refuse(path, 'config.{} = {!r}, but the table\'s {} = {!r}: '
                    'another model shape, length or evaluation, not pooled'
                    .format(peer_key, conf[peer_key], table_key, ours))
    if conf.get('eval_seed') != char_corpus.EVAL_SEED:
        _refuse(path, 'config.eval_seed = {!r}, but the evaluation batches '
                'are drawn with {} (char_corpus.EVAL_SEED): other batches, '
                'not pooled'.format(conf.get('eval_seed'),
                                    char_corpus.EVAL_SEED))
    sha = (record.get('corpus') or {}).get('sha256')
    if not sha:
        _refuse(path, 'corpus.sha256 is missing: its text cannot be '
                'checked against the table\'s')
    seed = record.get('seed')
    if isinstance(seed, bool) or not isinstance(seed, int):
        _refuse(path, 'seed = {!r}, expected an integer'.format(seed))
    final = record.get('final') or {}
    if record.get('diverged_at') is not None:
        status, val = R.DIVERGED, None
    else:
        val = final.get('val')
        if final.get('step') != conf['max_iters'] or not isinstance(
                val, (int, float)) or not math.isfinite(val):
            _refuse(path, 'final = {!r}: neither finished at step {} with '
                    'a finite val loss nor diverged (diverged_at)'.format(
                        final, conf['max_iters']))
        status = R.FINISHED
    return {'status': status, 'seed': seed, 'final_val_loss': val,
            'final_select_loss': final.get('select'),
            'diverged_at': record.get('diverged_at'),
            'corpus_sha256': sha, 'precision': record.get('precision'),
            'file': shown(path),
            'settings': {k: conf.get(k) for k, _ in SETTINGS}}


def _pooled(run):
    """[(key, value)] that every run of one row shares."""
    return [('precision', run['precision'])] + [
        ('config.' + k, run['settings'].get(k)) for k, _ in SETTINGS]


def load(cfg, peer, index):
    """{seed: run} of one entry of ``peers`` (its files read and checked,
    but not yet against the runs' corpus: :func:`check_corpus`)."""
    key = 'peers[{}]'.format(index)
    paths = []
    for j, pattern in enumerate(peer['files']):
        for path in resolve(pattern, '{}.files[{}]'.format(key, j)):
            if path not in paths:
                paths.append(path)
    runs, first = {}, None
    for path in paths:
        run = peer_run(read(path), path, cfg)
        if run['seed'] in runs:
            raise TableRefused('{} ({!r}): two files of seed {}: {} and {}'
                               .format(key, peer['label'], run['seed'],
                                       runs[run['seed']]['file'],
                                       run['file']))
        if first is None:
            first = run
        for (k, a), (_, b) in zip(_pooled(first), _pooled(run)):
            if not _same(a, b):
                raise TableRefused(
                    '{} ({!r}): peer file {} has {} = {!r}, but {} has {!r}: '
                    'a row pools one configuration over seeds'.format(
                        key, peer['label'], run['file'], k, b,
                        first['file'], a))
        runs[run['seed']] = run
    return runs


def check_corpus(peer_runs, runs):
    """Refuses a peer run whose text is not the one of every run of the
    table that records it (``corpus_sha256``). Returns whether any run
    recorded one (False: nothing to check against, said in the table)."""
    ours = {}
    for _, by_seed in sorted(runs.items()):
        for _, info in sorted(by_seed.items()):
            sha = info.get('corpus_sha256')
            if sha:
                ours.setdefault(sha, info.get('name') or '?')
    for run in peer_runs.values():
        for sha, name in sorted(ours.items()):
            if run['corpus_sha256'] != sha:
                raise TableRefused(
                    'peer file {}: corpus.sha256 {} differs from the '
                    'corpus_sha256 {} of the run {}: another text, not '
                    'pooled'.format(run['file'], run['corpus_sha256'], sha,
                                    name))
    return bool(ours)


def differing(cfg, peer_runs):
    """{setting: (the peer's, the table's)} of the :data:`SETTINGS` where
    the row's runs (all alike: :func:`load`) differ from the table."""
    if not peer_runs:
        return {}
    first = peer_runs[min(peer_runs)]['settings']
    out = {}
    for peer_key, table_key in SETTINGS:
        ours = _table_value(cfg, table_key)
        if not _same(first.get(peer_key), ours):
            out[peer_key] = (first.get(peer_key), ours)
    return out


def label(peer, peer_runs):
    """The row's label: "peer: <label>, lr <its learning rate>"."""
    lrs = {r['settings'].get('lr') for r in peer_runs.values()}
    lr = lrs.pop() if len(lrs) == 1 else None
    return 'peer: {}{}'.format(peer['label'], '' if lr is None
                               else ', lr {:g}'.format(lr))


def rows(cfg, runs):
    """``[(label, {seed: run}, info)]`` of the config's peers, in order,
    every file checked (``info``: the entry, its files, its differing
    settings, whether the corpus was checked)."""
    out = []
    for i, peer in enumerate(cfg.peers):
        peer_runs = load(cfg, peer, i)
        checked = check_corpus(peer_runs, runs)
        out.append((label(peer, peer_runs), peer_runs, {
            'label': peer['label'], 'patterns': list(peer['files']),
            'files': [peer_runs[s]['file'] for s in sorted(peer_runs)],
            'settings_differ': {k: {'peer': a, 'table': b} for k, (a, b)
                                in differing(cfg, peer_runs).items()},
            'corpus_checked': checked}))
    return out
