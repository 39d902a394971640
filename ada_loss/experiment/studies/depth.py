"""The depth study (issue 19): Table 1's claim (§4.1: adaptive scaling gains
most in the deepest network) in FP8 E4M3, on real data (Fashion-MNIST), at
CIFAR ResNet depths 20/56/110. Not a table of the paper.

The config (``configs/depth_study.yaml``) is a classification config — the
grid (models, dataset, modes, fixed scales, seeds, ``precisions``: mixed16
the control), model, data, train, log — plus a ``study`` section:

* ``fp32``: also one FP32 run per (model, seed);
* ``downsample``: integer factor of average pooling of the 28x28 images
  (CPU budget);
* ``fig4``: ``model``, ``precision``, ``seed``, ``every`` (probe every n
  steps), ``fixed`` (``best``: the best fixed scale of the finished sweep of
  that model and precision, else a mode such as ``fixed:256``) and ``run``.

Every run is a run of the classification study, through the one run path,
into ``<out>/<table>/<precision>/<run>/``: resumable, finished runs skipped.
Written at the end, from whatever runs have finished: ``table1.md`` (rows =
depth; columns FP32, then per precision None, Fixed (best), Fixed
(held-out: chosen on the other seeds), Dynamic, Adaptive (paper:
``guard=false``), Adaptive, Amax; then adaptive against the held-out fixed
scale paired by seed), ``table4.md`` (the fixed sweep per depth and precision),
``fig4a.png`` (α per layer over training, adaptive, FP8), ``fig4b.png``
(underflow rate of the gradient entering each GEMM: none vs best fixed vs
adaptive, FP8), ``fig4_records.csv`` and ``results.json``.
"""
import collections
import dataclasses
import functools
import hashlib
import json
import math
import os

import chainer
import matplotlib
import numpy

from ada_loss import atomic
from ada_loss.analysis import gemm_probe
from ada_loss.experiment import config as C
from ada_loss.experiment import runinfo as R
from ada_loss.experiment import verdicts as V
from ada_loss.experiment.config import section, setting
from ada_loss.experiment.data import dataset_info
from ada_loss.experiment.mode_history import (
    constant_alpha_note, ran_with_constant_alpha)
from ada_loss.experiment.modes import column_label, mode_columns
from ada_loss.experiment.runner import config_changes, decide, run_locked
from ada_loss.experiment.studies import classification
from ada_loss.experiment.studies.classification import Cell
from ada_loss.precision import parse_precision
from ada_loss.scaling import parse_mode

matplotlib.use('Agg')

COLUMNS = ('None', 'Fixed (best)', 'Fixed (held-out)', 'Dynamic',
           'Adaptive (paper)', 'Adaptive', 'Adaptive (authors)', 'Amax')
#: the FP32 runs' mode and precision
FP32, FLOAT32 = parse_mode('fp32'), parse_precision('float32')

#: modes whose runs an earlier edition's ``results.json`` may supply
#: (``study.reuse``): those on Chainer's own backward (plain or scaled),
#: which the overflow guard and the layer-wise changes do not touch
REUSABLE = ('fp32', 'none', 'fixed', 'dynamic')

#: run-config keys that do not change a grid run's numbers, besides the
#: runner's presentation keys (runner.PRESENTATION): not compared on a
#: rerun (DepthStudy.not_compared), nor, with the folder's name, when an
#: earlier edition's run is reused
NOT_NUMBERS = ('study.reuse', 'study.fig4', 'study.fp32',
               'study.choose_fixed_on', 'study.runs_from')


@dataclasses.dataclass
class Fig4:
    model: C.ModelName = setting('resnet110', 'model of the probed runs')
    precision: C.PrecisionName = setting('fp8_e4m3', 'their precision')
    seed: int = setting(0, 'their seed', minimum=0)
    every: int = setting(10, 'probe every n steps', minimum=1)
    fixed: str = setting('best', "the fixed scale compared: 'best' (the "
                         'best of the finished sweep) or a mode fixed:S')
    run: bool = setting(True, 'train the probed runs and draw Fig. 4a/4b '
                              'after the grid')


@dataclasses.dataclass
class StudySettings:
    fp32: bool = setting(True, 'also one FP32 run per (model, seed)')
    downsample: int = setting(2, 'average pooling factor of the 28x28 '
                              'images (CPU budget)', minimum=1)
    fig4: Fig4 = section(Fig4)
    reuse: str = setting('', "an earlier edition's results.json: its none, "
                         'fixed and dynamic runs fill the cells that have '
                         'no run folder here (check one cell reproduces '
                         'first)')
    runs_from: str = setting(
        '', "an earlier edition's results.json whose run folders are not "
        'here: every cell without a run folder takes its run from it (to '
        're-print its tables with this code; their config is unverified, '
        'as the tables say)')
    choose_fixed_on: str = setting(
        '', "other seeds' results.json (an earlier cell's): the fixed scale "
        'each method is compared with is the best mean there, scored on '
        "this grid's seeds (a confirmation on new seeds); default: chosen "
        "on this grid's other seeds")


@dataclasses.dataclass
class Config(classification.Config):
    """The depth study: a classification config (``grid.precisions``: the
    precisions, mixed16 the control) plus ``study``."""
    study: StudySettings = section(StudySettings)

    def check(self):
        """As a classification config's; Fig. 4's probed runs observe the
        backward with NumPy, so they are refused on a device (before the
        grid, not after it)."""
        super(Config, self).check()
        path = self.study.runs_from
        if path and not os.path.isfile(path):
            raise C.ConfigError('study.runs_from', "expected a depth study's "
                                'results.json; no such file: {!r}'
                                .format(path))
        path = self.study.choose_fixed_on
        if path and not os.path.isfile(path):
            raise C.ConfigError('study.choose_fixed_on', 'expected a depth '
                                "study's results.json (of other seeds); no "
                                'such file: {!r}'.format(path))
        if self.device is not None and self.study.fig4.run:
            raise C.ConfigError('study.fig4.run', "Fig. 4's probed runs "
                                '(log.probe_every) read gradients with '
                                'NumPy: set it to false with device {} '
                                '(the grid trains on the device; the '
                                'probed runs can follow on the '
                                'CPU)'.format(self.device))


class Downsample(object):
    """Average pooling of an example's image by ``factor`` (picklable)."""

    def __init__(self, factor):
        self.factor = int(factor)

    def __call__(self, example):
        x, t = example
        f = self.factor
        if f == 1:
            return x, t
        c, h, w = x.shape
        x = x[:, :h - h % f, :w - w % f].reshape(
            c, h // f, f, w // f, f).mean(axis=(2, 4))
        return x.astype(numpy.float32), t


class DepthStudy(classification.ClassificationStudy):
    """The grid's runs are the classification study's (one folder per
    precision), on downsampled images; the tables and Fig. 4 at the end."""
    Config = Config
    not_compared = NOT_NUMBERS

    def cells(self, cfg):
        """FP32 cells (precision float32) then every mode in every precision
        of ``grid.precisions``, seed-major."""
        g = cfg.grid
        out = []
        for s in g.seeds:
            if cfg.study.fp32:
                out += [Cell(m, d, FP32, s, FLOAT32) for m in g.models
                        for d in g.datasets]
            out += [c for c in super(DepthStudy, self).cells(cfg)
                    if c.seed == s]
        return out

    def runs_elsewhere(self, cfg):
        return bool(cfg.study.runs_from)

    def preload(self, cfg, cells):
        tf = Downsample(cfg.study.downsample)
        return {key: tuple(d if d is None else
                           chainer.datasets.TransformDataset(d, tf)
                           for d in data)
                for key, data in super(DepthStudy, self).preload(
                    cfg, cells).items()}

    def write_tables(self, cfg, out, quiet=False, train=True):
        """The tables, then Fig. 4 from its probed runs (trained here
        unless ``train`` is False: ``--table-only`` trains nothing and
        draws Fig. 4 only when its runs are there)."""
        runs, left = collect(self, cfg, out)
        t1, t4 = write_outputs(cfg, out, runs, left)
        if not quiet:
            print(t1)
            print(t4)
        if cfg.study.fig4.run:
            for path in fig4(self, cfg, out, runs, train=train):
                print('[depth] wrote', path)
        return None


def collect(study, cfg, out):
    """``(runs, left_out)``: {(precision, model, mode): [run.json dicts]}
    of the existing runs (and of ``study.reuse``'s, see :data:`REUSABLE`;
    precision and mode as text), and ``[(run name, why)]`` of the reused
    runs left out because their config is not this one (or unknown)."""
    runs, left = collections.defaultdict(list), []
    for cell in study.cells(cfg):
        folder = study.folder(out, cfg, cell)
        info = R.read_run(folder)
        key = (str(cell.precision), cell.model, str(cell.mode))
        if info:
            runs[key].append(dict(info, **pooled_config(study, cfg, cell,
                                                        folder)))
        elif cfg.study.runs_from:
            old = _reused(cfg.study.runs_from).get(key + (cell.seed,))
            if old is not None:
                runs[key].append(dict(old))
        elif cfg.study.reuse and cell.mode.name in REUSABLE:
            old = _reused(cfg.study.reuse).get(key + (cell.seed,))
            if old is None:
                continue
            why = reuse_changes(study, cfg, cell)
            if why:
                left.append((study.run_name(cfg, cell), why))
            else:
                runs[key].append(dict(old, reused=True))
    return runs, left


def pooled_config(study, cfg, cell, folder):
    """What the table knows of the config a run it pools ran (issue 47:
    pooled runs must share the table's config): ``config_sha256`` of its
    ``config.yaml`` and ``config_differs``, the keys that determine the
    numbers and differ from the cell's config now (None: no readable
    ``config.yaml``, so unverified), and ``batchsize``, the batch size it
    ran (the loss gradient's rows: :func:`provenance_note`)."""
    path = os.path.join(folder, R.CONFIG_YAML)
    try:
        with open(path, 'rb') as f:
            raw = f.read()
        saved = C.read_yaml(path)
    except (OSError, C.ConfigError):
        return {'config_differs': None}
    out = {'config_sha256': hashlib.sha256(raw).hexdigest(),
           'config_differs': config_changes(
               saved, C.to_plain(study.run_config(cfg, cell)),
               study.not_compared)}
    batchsize = (saved.get('train') or {}).get('batchsize') \
        if isinstance(saved, dict) else None
    if isinstance(batchsize, int):
        out['batchsize'] = batchsize
    return out


def provenance_note(runs, batchsize=None):
    """Footnote of what the pooled runs ran: those whose config differs
    from the table's in a key that determines the numbers (named), the
    runs of each data set where their data records name more than one (a
    config's data keys name a folder, not the files in it), those whose
    config could not be checked, the commits they ran at, and those that
    ran ``adaptive`` at the old default α_{N+1} = 1 where today's default
    (``init_scale=format``) would not
    (:func:`~ada_loss.experiment.mode_history.ran_with_constant_alpha`; B:
    the run's own batch size, else ``batchsize``, the table's)."""
    differ, unknown, commits = [], 0, collections.Counter()
    data = collections.defaultdict(list)
    constant = []
    for (p, m, mode), rs in sorted(runs.items()):
        for r in rs:
            if ran_with_constant_alpha(r, mode, p,
                                       r.get('batchsize') or batchsize):
                constant.append('{} {} {} seed {}'.format(
                    m, p, mode, r.get('seed')))
            commits[(r.get('git_commit') or 'unknown')[:10]] += 1
            record = r.get('data')
            if isinstance(record, dict) and record.get('fingerprint'):
                # the data files a run read (run.json's data record): two
                # fingerprints are two data sets pooled in one table
                data[record['fingerprint'][:10]].append(
                    '{} {} {} seed {}'.format(m, p, mode, r.get('seed')))
            keys = r.get('config_differs', None)
            if 'config_differs' not in r or keys is None:
                unknown += 1
            elif keys:
                differ.append('{} {} {} seed {} ({})'.format(
                    m, p, mode, r.get('seed'), ', '.join(keys)))
    lines = []
    if differ:
        lines.append('**{} pooled runs ran another config than this '
                     "table's** (the keys that differ): {}.".format(
                         len(differ), '; '.join(differ[:8]) + (
                             '; …' if len(differ) > 8 else '')))
    if len(data) > 1:
        lines.append('**The pooled runs read different data files** (the '
                     'fingerprint of their data record: runs): {}.'.format(
                         '; '.join('{} ({}: {}{})'.format(
                             fp, len(names), ', '.join(names[:2]),
                             ', …' if len(names) > 2 else '')
                             for fp, names in sorted(data.items()))))
    if unknown:
        lines.append('{} pooled runs have no config.yaml to check (runs '
                     'reused from a results.json): their config is '
                     'unverified.'.format(unknown))
    if constant:
        lines.append(constant_alpha_note(constant))
    if commits:
        lines.append('Commits of the pooled runs: {}.'.format(', '.join(
            '{} ({})'.format(c, n) for c, n in sorted(commits.items()))))
    return '\n'.join(lines)


def reuse_changes(study, cfg, cell):
    """Why a run of ``study.reuse`` does not fit this config: the keys that
    determine its numbers and differ from the edition's config (the
    ``config.yaml`` beside its results.json), or that there is none."""
    edition = os.path.join(os.path.dirname(cfg.study.reuse), R.CONFIG_YAML)
    if not os.path.exists(edition):
        return 'no {} beside {} to check its config'.format(
            R.CONFIG_YAML, cfg.study.reuse)
    old = _edition(study, edition)
    keys = config_changes(C.to_plain(study.run_config(old, cell)),
                          C.to_plain(study.run_config(cfg, cell)),
                          study.not_compared + ('table',))
    return 'config differs ({})'.format(', '.join(keys)) if keys else None


@functools.lru_cache(maxsize=4)
def _edition(study, path):
    """The config an earlier edition ran (checked like any config)."""
    return study.load_config(path, ())


@functools.lru_cache(maxsize=4)
def _reused(path):
    """{(precision, model, mode, seed): run dict} of a results.json (the
    modes' canonical text)."""
    with open(path) as f:
        raw = json.load(f)
    out = {}
    for k, rs in raw.items():
        precision, model, mode = k.split('|')
        for r in rs:
            out[precision, model, str(parse_mode(mode)), r['seed']] = r
    return out


def _fixed_scale(mode):
    """The scale of a ``fixed:S`` mode text (inf for any other mode)."""
    if not mode.startswith('fixed:'):
        return float('inf')
    return float(mode.split(':')[1])


def _ascending(items):
    """``(mode, value)`` items of fixed modes by ascending scale: where two
    scales tie, the first met -- the smaller -- is kept, whatever order
    the runs came in (a config's grid order, or results.json's, whose keys
    sort as text: fixed:16 before fixed:4)."""
    return sorted(items, key=lambda kv: _fixed_scale(kv[0]))


def _design_sweep(path):
    """{(precision, model): {mode: [run dict]}} of the fixed runs of a
    results.json (the precision's and the mode's canonical text)."""
    sweep = collections.defaultdict(collections.OrderedDict)
    for (precision, model, mode, seed), r in _reused(path).items():
        if mode.startswith('fixed:'):
            key = (str(parse_precision(precision)), model)
            sweep[key].setdefault(mode, []).append(r)
    return sweep


@functools.lru_cache(maxsize=4)
def chosen_splits(path):
    """{(precision, model): 'validation' | 'test'}: the split each of
    :func:`chosen_scales`' choices was made on — the other grid's runs',
    not this one's (a confirmation's own runs may record a selection split
    that the choice never saw)."""
    return {key: selection_split([r for rs in modes.values() for r in rs])
            for key, modes in _design_sweep(path).items()}


@functools.lru_cache(maxsize=4)
def chosen_scales(path):
    """{(precision, model): 'S'}: per depth and precision, the fixed scale
    with the best mean final accuracy over the runs of a results.json (the
    precision's and the mode's canonical text). As in
    :func:`held_out_fixed`, a tie keeps the smaller scale and a scale
    with a run that did not finish is no candidate — here on any seed of
    the file (there is no scored seed among them)."""
    sweep = _design_sweep(path)
    out = {}
    for key, modes in sweep.items():
        split = SPLIT_KEYS[chosen_splits(path)[key]]
        best = None
        for mode, rs in _ascending(modes.items()):
            accs = [_accuracy(r, split) for r in rs]
            if None in accs:
                continue
            mean = float(numpy.mean(accs))
            if best is None or mean > best[0]:
                best = (mean, mode)
        if best is not None:
            out[key] = best[1].split(':')[1]
    return out


def _chosen(cfg):
    """``study.choose_fixed_on``'s scales, or None (chosen on this grid's
    other seeds)."""
    path = getattr(cfg.study, 'choose_fixed_on', '')
    return chosen_scales(path) if path else None


def stats(runs):
    """(mean %, sample std %, n finished, n diverged, mean skipped)."""
    accs = [100.0 * r['final_test_accuracy'] for r in runs
            if r.get('status') == R.FINISHED
            and r.get('final_test_accuracy') is not None]
    div = sum(r.get('status') == R.DIVERGED for r in runs)
    skipped = [r.get('skipped_steps') or 0 for r in runs
               if r.get('status') in (R.FINISHED, R.DIVERGED)]
    mean = float(numpy.mean(accs)) if accs else None
    std = float(numpy.std(accs, ddof=1)) if len(accs) > 1 else None
    return mean, std, len(accs), div, (float(numpy.mean(skipped))
                                       if skipped else 0.0)


def cell_text(s, note=''):
    mean, std, n, div, skipped = s
    if mean is None:
        return 'diverged ({})'.format(div) if div else '—'
    t = '{:.2f}'.format(mean) + (' ± {:.2f}'.format(std) if std is not None
                                 else '') + note
    if n > 1 or div:
        t += ' (n={}{})'.format(n, ', {} diverged'.format(div) if div else '')
    if skipped:
        t += ' [{:g} skipped]'.format(round(skipped, 1))
    return t


def _mode_columns(runs, precision):
    """``[(label, mode text)]`` of the modes with runs of ``precision``
    (fixed scales and fp32 aside), in :data:`COLUMNS` order: a column per
    mode, two modes sharing a label labelled by their text (issue 39:
    ``adaptive`` and ``adaptive:init_scale=auto`` in one column)."""
    cols = mode_columns({mode for (p, _, mode), rs in runs.items()
                         if p == precision and rs and mode != 'fp32'
                         and not mode.startswith('fixed:')})
    return sorted(cols, key=lambda c: (
        COLUMNS.index(column_label(c[1]))
        if column_label(c[1]) in COLUMNS else len(COLUMNS), c[1]))


def _accuracy(run, key='final_test_accuracy'):
    if run.get('status') != R.FINISHED or run.get(key) is None:
        return None
    return 100.0 * run[key]


#: the run.json key a choice is made on, per split (issue 47): the
#: selection split of the training images (``data.val_size``) where every
#: candidate run recorded it, else — runs from before it existed — the
#: test images, which the tables then say
SPLIT_KEYS = {'validation': 'final_val_accuracy',
              'test': 'final_test_accuracy'}


def selection_split(candidates):
    """'validation' where every finished run of ``candidates`` (run dicts)
    recorded its selection accuracy, else 'test'."""
    done = [r for r in candidates if r.get('status') == R.FINISHED]
    if done and all(r.get('final_val_accuracy') is not None for r in done):
        return 'validation'
    return 'test'


def held_out_fixed(runs, precision, model, chosen=None):
    """The best fixed scale chosen without the seed it is scored on (the
    winner's curse: the best of five noisy means is biased upward): for
    each seed, the scale with the best mean accuracy over the *other*
    seeds — on the selection split (:func:`selection_split`) where the
    runs recorded it, so that the images it is chosen on are not the test
    images it is scored on — scored on this seed — or, with ``chosen`` ({(precision, model):
    'S'}, :func:`chosen_scales` of other seeds' runs), that scale on every
    seed (a confirmation on seeds the scale was not chosen on). Returns
    ({seed: run dict}, {seed: S}). Of scales whose means tie, the smaller
    is chosen."""
    sweep = {mode: {r['seed']: r for r in rs}
             for (p, m, mode), rs in runs.items()
             if p == precision and m == model and mode.startswith('fixed:')}
    if chosen is not None:
        scale = chosen.get((precision, model))
        by_seed = sweep.get('fixed:{}'.format(scale), {})
        return dict(by_seed), {seed: scale for seed in by_seed}
    seeds = sorted({s for by_seed in sweep.values() for s in by_seed})
    split = SPLIT_KEYS[selection_split(
        [r for by_seed in sweep.values() for r in by_seed.values()])]
    chosen, scales = {}, {}
    for seed in seeds:
        best = None
        for mode, by_seed in _ascending(sweep.items()):
            others = [_accuracy(r, split) for s, r in by_seed.items()
                      if s != seed]
            if not others or None in others or seed not in by_seed:
                continue
            mean = float(numpy.mean(others))
            if best is None or mean > best[0]:
                best = (mean, mode)
        if best is not None:
            chosen[seed] = sweep[best[1]][seed]
            scales[seed] = best[1].split(':')[1]
    return chosen, scales


def _by_seed(rs):
    return {r['seed']: r for r in rs}


def _differences(mine, theirs):
    """Paired differences (points) over the seeds where both finished:
    a pair with a diverged side is dropped (which side diverged then
    decides the direction of what is hidden: issue 47)."""
    out = []
    for seed, r in sorted(mine.items()):
        a, b = _accuracy(r), _accuracy(theirs.get(seed, {}))
        if a is not None and b is not None:
            out.append(a - b)
    return out


def chance_points(cfg):
    """Accuracy (points) of guessing, at which a diverged run is scored:
    100 / the number of classes of the grid's dataset."""
    return 100.0 / dataset_info(cfg.grid.datasets[0])[0]


def _scored(run, chance):
    """A run's accuracy with a diverged one (or one that finished without
    an accuracy) scored at ``chance``; None for a run that has not ended."""
    if run.get('status') not in (R.FINISHED, R.DIVERGED):
        return None
    a = _accuracy(run)
    return chance if a is None else a


def differences_at_chance(mine, theirs, chance):
    """Paired differences (points) over the seeds where both runs ended
    (finished or diverged), a diverged run scored at ``chance``: every
    failure counts against the method that failed."""
    out = []
    for seed, r in sorted(mine.items()):
        a, b = _scored(r, chance), _scored(theirs.get(seed, {}), chance)
        if a is not None and b is not None:
            out.append(a - b)
    return out


def _method_modes(runs, precision, model):
    """The grid's non-fixed modes with runs of (precision, model), in
    column order."""
    modes = {mode for (p, m, mode), rs in runs.items()
             if p == precision and m == model and rs and mode != 'fp32'
             and not mode.startswith('fixed:')}
    return [mode for _, mode in _mode_columns(
        {(precision, model, mode): runs[(precision, model, mode)]
         for mode in modes}, precision)]


def paired(cfg, runs):
    """Per depth, precision and method (every non-fixed mode of the grid):
    the method against the fixed scale chosen on the other seeds, paired
    by seed: the mean difference (points) with its 95 % interval, the
    verdict (ahead / level / behind: the interval above, containing or
    below 0) and the seeds where the method is ahead."""
    chosen = _chosen(cfg)

    def pairs():
        for m in cfg.grid.models:
            for p in (str(p) for p in cfg.grid.precisions):
                fixed, _ = held_out_fixed(runs, p, m, chosen)
                # a scale chosen elsewhere but not trained here keeps the
                # methods' rows (saying so) rather than dropping them
                if fixed or (chosen is not None and (p, m) in chosen):
                    for mode in _method_modes(runs, p, m):
                        yield m, p, mode, _by_seed(runs[(p, m, mode)]), fixed
    return _paired_table('Fixed (held-out)', pairs(), chance_points(cfg))


def _paired_table(theirs_label, pairs, chance):
    """The paired table of ``pairs`` — (model, precision, mode, {seed: run}
    of the method, {seed: run} it is compared with) — both ways (issue 47):
    the mean paired difference over the seeds where both finished (pairs
    with a diverged side dropped) and over the seeds where both ended, a
    diverged run scored at ``chance``; the verdict, the Holm-adjusted
    verdict over the table's rows (:func:`~ada_loss.experiment.verdicts
    .holm_verdicts`) and the seeds ahead are the second's. A method with
    runs but no seed where both ended keeps its row, saying so, rather
    than vanishing; the header alone when no method has runs."""
    header = ['Depth', 'Precision', 'Method', 'Method', theirs_label,
              'Method − {}, pairs dropped'.format(theirs_label),
              'Method − {}, diverged at chance'.format(theirs_label),
              'verdict', 'Holm', 'ahead']
    rows = []
    for m, p, mode, mine, theirs in pairs:
        cells = [m, p, mode, cell_text(stats(list(mine.values()))),
                 cell_text(stats(list(theirs.values()))) if theirs else '—']
        scored = differences_at_chance(mine, theirs, chance)
        if not scored:
            if mine:
                rows.append((cells + ['—', '—', 'no seed where both ended',
                                      '—', '0/0'], None))
            continue
        dropped = V.paired(_differences(mine, theirs))
        v = V.paired(scored)
        rows.append((cells + [V.paired_text(dropped), V.paired_text(v),
                              v.verdict, None, '{}/{}'.format(
                                  sum(d > 0 for d in scored), len(scored))],
                     v))
    holm = V.holm_verdicts([v for _, v in rows if v is not None])
    lines = []
    for cells, v in rows:
        if v is not None:
            cells[-2] = holm.pop(0) or '—'
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(['| ' + ' | '.join(header) + ' |',
                      '|' + '---|' * len(header)] + lines)


def without_grad_loss(precision):
    """The recipe a ``grad=loss`` precision is compared with: its text
    without ``grad=loss`` (None if it has no such option)."""
    name, _, options = str(precision).partition(':')
    opts = [o for o in options.split(',') if o]
    if 'grad=loss' not in opts:
        return None
    rest = [o for o in opts if o != 'grad=loss']
    return str(parse_precision(name + (':' + ','.join(rest) if rest
                                       else '')))


def recipe_paired(cfg, runs, base_mode='none'):
    """Per depth, ``grad=loss`` precision and method: the method (its
    gradients scaled by loss scaling inside the recipe) against the recipe
    with its own gradient scaling (the same precision without
    ``grad=loss``, mode ``none``), paired by seed, with the 95 % interval
    and the verdict."""
    def pairs():
        for m in cfg.grid.models:
            for p in (str(p) for p in cfg.grid.precisions):
                base = without_grad_loss(p)
                if base is None:
                    continue
                theirs = _by_seed(runs.get((base, m, base_mode), []))
                for mode in _method_modes(runs, p, m):
                    yield m, p, mode, _by_seed(runs[(p, m, mode)]), theirs
    table = _paired_table('Recipe', pairs(), chance_points(cfg))
    return table if table.count('\n') > 1 else ''


def full_recipe(precision):
    """The precision a variant is compared with in :func:`variant_paired`:
    the same recipe with its other options at their defaults — the name
    alone (``nvfp4`` for ``nvfp4:rht=false``), or the name with its
    ``recipe=`` (``fp8:recipe=blockwise`` for
    ``fp8:recipe=blockwise,pow2=true``: a recipe is a different precision
    from the unscaled format, never its variant). None where ``precision``
    is that already, or carries ``grad=loss`` (:func:`recipe_paired`
    compares those)."""
    text = str(parse_precision(str(precision)))
    name, _, options = text.partition(':')
    opts = [o for o in options.split(',') if o]
    if not opts or 'grad=loss' in opts:
        return None
    keep = [o for o in opts if o.startswith('recipe=')]
    base = str(parse_precision(name + (':' + keep[0] if keep else '')))
    return None if base == text else base


def variant_paired(cfg, runs, mode='none'):
    """Per depth and precision variant (an option switched, e.g.
    ``nvfp4:rht=false``): the variant against the full recipe (its name
    alone), both with ``mode`` (``none``: the recipes' own scaling), paired
    by seed, with the 95 % interval and the verdict: what each part of a
    recipe buys (issue 33). Empty when the grid has no such pair."""
    def pairs():
        for m in cfg.grid.models:
            for p in (str(p) for p in cfg.grid.precisions):
                base = full_recipe(p)
                if base is None or not runs.get((base, m, mode)) or \
                        not runs.get((p, m, mode)):
                    continue
                yield (m, p, mode, _by_seed(runs[(p, m, mode)]),
                       _by_seed(runs[(base, m, mode)]))
    table = _paired_table('Full recipe', pairs(), chance_points(cfg))
    return table if table.count('\n') > 1 else ''


def option_paired(cfg, runs):
    """Per depth, precision and mode with options (``adaptive:init_scale=
    amax``, ``adaptive:guard=false``): the mode against its name alone with
    every option at its default (``adaptive``), in the same precision,
    paired by seed, with the 95 % interval and the verdict: what an option
    of a mode buys (issue 32 item 2: an option becomes the default only if
    it wins on seeds it was not chosen on). Empty when the grid has no
    such pair."""
    def pairs():
        for m in cfg.grid.models:
            for p in (str(p) for p in cfg.grid.precisions):
                for mode in _method_modes(runs, p, m):
                    base = parse_mode(mode).name
                    if base == mode or not runs.get((p, m, base)):
                        continue
                    yield (m, p, mode, _by_seed(runs[(p, m, mode)]),
                           _by_seed(runs[(p, m, base)]))
    table = _paired_table('Mode default', pairs(), chance_points(cfg))
    return table if table.count('\n') > 1 else ''


#: a run collapses when it ends more than this many points below FP32
COLLAPSE_POINTS = 20.0


def robustness(cfg, runs):
    """Per depth, precision and mode (fixed scales included, and the
    held-out fixed scale the paired tables compare with): the spread
    over seeds and the share of runs that diverged or collapsed (ended more
    than :data:`COLLAPSE_POINTS` below the FP32 run of the same seed, or
    below the FP32 mean where that seed has none), with Wilson's 95 %
    interval. Empty without FP32 runs."""
    header = ['Depth', 'Precision', 'Mode', 'mean ± std (n)',
              'collapsed or diverged (95 %)']
    lines = []
    chosen = _chosen(cfg)
    for m in cfg.grid.models:
        ref = _by_seed(runs.get(('float32', m, 'fp32'), []))
        ref_mean = stats(list(ref.values()))[0]
        if ref_mean is None:
            continue
        for p in (str(p) for p in cfg.grid.precisions):
            modes = sorted({mode for (pp, mm, mode), rs in runs.items()
                            if pp == p and mm == m and rs},
                           key=_mode_order)
            rows = [(mode, runs[(p, m, mode)]) for mode in modes]
            held, _ = held_out_fixed(runs, p, m, chosen)
            if held:
                # the scale a method is compared with fails too, and its
                # failures count as much as the method's (issue 47)
                rows.append(('Fixed (held-out)', list(held.values())))
            for mode, rs in rows:
                done = [r for r in rs
                        if r.get('status') in (R.FINISHED, R.DIVERGED)]
                bad = 0
                for r in done:
                    a = _accuracy(r)
                    floor = _accuracy(ref.get(r['seed'], {}))
                    floor = ref_mean if floor is None else floor
                    bad += a is None or a < floor - COLLAPSE_POINTS
                lines.append('| {} | {} | {} | {} | {} |'.format(
                    m, p, mode, cell_text(stats(rs)),
                    V.rate_text(bad, len(done))))
    if not lines:
        return ''
    return '\n'.join(['| ' + ' | '.join(header) + ' |',
                      '|' + '---|' * len(header)] + lines)


def _mode_order(mode):
    if mode.startswith('fixed:'):
        return (1, float(mode.split(':')[1]), mode)
    return (0 if mode == 'none' else 2, 0.0, mode)


def best_fixed(runs, precision, model):
    """(mode, stats) of the fixed scale with the best mean among those
    none of whose runs diverged (a tie: the smaller scale), or (None,
    None); ``runs`` as :func:`collect` returns them."""
    best = (None, None)
    precision = str(precision)
    for (p, m, mode), rs in sorted(runs.items(), key=lambda kv: (
            _fixed_scale(kv[0][2]), kv[0])):
        if p != precision or m != model or not mode.startswith('fixed:'):
            continue
        s = stats(rs)
        if s[0] is not None and not s[3] and (
                best[1] is None or s[0] > best[1][0]):
            best = (mode, s)
    return best


def _present(runs, precision):
    """``[(column, mode text or None)]`` of ``precision``: None first, the
    fixed scales' two columns (where there are fixed runs), then a column
    per mode."""
    cols = _mode_columns(runs, precision)
    head = [c for c in cols if c[0] == 'None']
    if any(p == precision and mode.startswith('fixed:')
           for p, _, mode in runs):
        head += [('Fixed (best)', None), ('Fixed (held-out)', None)]
    return head + [c for c in cols if c[0] != 'None']


def table1(cfg, runs):
    """Rows = depth; FP32, then per precision the columns that have runs."""
    models = cfg.grid.models
    header = ['Depth']
    if cfg.study.fp32:
        header.append('FP32')
    precisions = [str(p) for p in cfg.grid.precisions]
    columns = {p: _present(runs, p) for p in precisions}
    for p in precisions:
        header += ['{} {}'.format(p, c) for c, _ in columns[p]]
    lines = ['| ' + ' | '.join(header) + ' |',
             '|' + '---|' * len(header)]
    chosen = _chosen(cfg)
    for m in models:
        row = [m]
        if cfg.study.fp32:
            row.append(cell_text(stats(runs.get(('float32', m, 'fp32'), []))))
        for p in precisions:
            mode, s = best_fixed(runs, p, m)
            held, scales = held_out_fixed(runs, p, m, chosen)
            for c, col_mode in columns[p]:
                if c == 'Fixed (best)':
                    row.append(cell_text(s, ' (S={})'.format(
                        mode.split(':')[1])) if s else '—')
                elif c == 'Fixed (held-out)':
                    row.append(cell_text(stats(list(held.values())), ' (S={})'
                                         .format('/'.join(
                                             scales[k] for k in sorted(
                                                 scales)))) if held else '—')
                else:
                    row.append(cell_text(stats(runs.get((p, m, col_mode),
                                                        []))))
        lines.append('| ' + ' | '.join(row) + ' |')
    return '\n'.join(lines)


def table4(cfg, runs):
    scales = sorted(cfg.grid.fixed_scales)
    header = ['Depth', 'Precision'] + ['S={:g}'.format(s) for s in scales]
    lines = ['| ' + ' | '.join(header) + ' |',
             '|' + '---|' * len(header)]
    for m in cfg.grid.models:
        for p in map(str, cfg.grid.precisions):
            row = [m, p] + [cell_text(stats(runs.get(
                (p, m, 'fixed:{:g}'.format(s)), []))) for s in scales]
            lines.append('| ' + ' | '.join(row) + ' |')
    return '\n'.join(lines)


# -- Fig. 4 ---------------------------------------------------------------
def fig4(study, cfg, out, runs, log=print, train=True):
    """Probed runs of ``study.fig4`` (none, best fixed, adaptive) and the two
    figures. The probed runs are runs of this study with ``log.probe_every``
    (the one run path: resumable, skipped once finished) in
    ``<out>/<table>/fig4/``; a diverged one is not run again (its records
    end where it stopped). ``train`` False: none is trained, and the
    figures are drawn only when all three are there. Returns the paths
    written (none when skipped)."""
    f = cfg.study.fig4
    folder = os.path.join(out, cfg.table)
    fixed = f.fixed
    if fixed == 'best':
        fixed = best_fixed(runs, f.precision, f.model)[0]
        if fixed is None:
            log('[depth] fig4: no finished fixed sweep of {} in {} yet; '
                'skipped'.format(f.model, f.precision))
            return []
    modes = ['none', fixed, 'adaptive']
    probed = C.replace(cfg, table=cfg.table + '/fig4', log=C.replace(
        cfg.log, probe_every=f.every))
    cells = [Cell(f.model, cfg.grid.datasets[0], parse_mode(mode), f.seed,
                  f.precision) for mode in modes]
    cache = None
    records, infos = [], {}
    for cell in cells:
        run_folder = study.folder(out, probed, cell)
        info = R.read_run(run_folder)
        if (info or {}).get('status') not in (R.FINISHED, R.DIVERGED):
            if not train:
                log('[depth] fig4: its run {} is not there (--table-only '
                    'trains nothing); skipped'.format(run_folder))
                return []
            # continued from its snapshot unless its config changed
            action, reason = decide(study, probed, cell, out, True, False)
            if action == 'refuse':
                log('[depth] fig4: {}; skipped'.format(reason))
                return []
            if cache is None:
                cache = study.preload(probed, cells)
            info = run_locked(study, probed, cell, out,
                              resume=action == 'resume', cache=cache)
        infos[str(cell.mode)] = {k: info.get(k) for k in (
            'status', 'final_test_accuracy', 'skipped_steps', 'iterations')}
        log('[depth] fig4 {} {}: acc {} skipped {}'.format(
            f.model, cell.mode, info.get('final_test_accuracy'),
            info.get('skipped_steps')))
        records += gemm_probe.load_csv(os.path.join(run_folder, 'probe.csv'))
    gemm_probe.save_csv(records, os.path.join(folder, 'fig4_records.csv'))
    atomic.write_text(os.path.join(folder, 'fig4_runs.json'), json.dumps(
        {'modes': modes, 'runs': infos}, indent=2))
    title = '{} on {} ({}x{} px), {}'.format(
        f.model, cfg.grid.datasets[0], 28 // cfg.study.downsample,
        28 // cfg.study.downsample, f.precision)
    return [plot_fig4a(records, os.path.join(folder, 'fig4a.png'),
                       'Fig. 4a: adaptive α per layer, ' + title,
                       float(fixed.split(':')[1])),
            plot_fig4b(records, modes, os.path.join(folder, 'fig4b.png'),
                       'Fig. 4b: underflow of the gradient entering each '
                       'GEMM, ' + title)]


def _plt():
    import matplotlib.pyplot as plt     # optional dependency, drawn late
    return plt


def plot_fig4a(records, path, title, fixed_scale):
    plt = _plt()
    rs = [r for r in records if r['mode'] == 'adaptive']
    its = sorted({r['iteration'] for r in rs})
    fig, ax = plt.subplots(figsize=(8, 4))
    cmap = plt.get_cmap('viridis')
    for i, it in enumerate(its):
        mine = sorted((r for r in rs if r['iteration'] == it),
                      key=lambda r: r['layer_id'])
        ax.plot([r['layer_id'] for r in mine],
                [math.log2(r['alpha']) for r in mine], lw=1,
                color=cmap(i / max(len(its) - 1, 1)),
                label='iteration {}'.format(it) if i in (
                    0, len(its) - 1) else None)
    ax.axhline(math.log2(fixed_scale), ls='--', color='k', lw=1,
               label='best fixed S = {:g}'.format(fixed_scale))
    ax.set_xlabel('layer ID (0 = nearest the loss)')
    ax.set_ylabel('log2 α')
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_fig4b(records, modes, path, title):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    for mode in modes:
        by_layer = collections.defaultdict(list)
        for r in records:
            if r['mode'] == mode and not math.isnan(r['uf_in']):
                by_layer[r['layer_id']].append(r['uf_in'])
        ids = sorted(by_layer)
        ax.plot(ids, [100 * numpy.mean(by_layer[i]) for i in ids],
                marker='.', ms=3, lw=1, label=mode)
    ax.set_xlabel('layer ID (0 = nearest the loss)')
    ax.set_ylabel('underflow rate (%), mean over training')
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def split_note(cfg, runs):
    """Which images chose the held-out fixed scale of each depth and
    precision (issue 47): the selection split or, for runs that recorded
    none, the test images the tables report. With
    ``study.choose_fixed_on`` the choice was made on that file's runs, so
    its runs say which split chose (:func:`chosen_splits`), for each depth
    and precision with runs here that it chose a scale for."""
    by_split = collections.defaultdict(list)
    path = getattr(getattr(cfg, 'study', None), 'choose_fixed_on', '')
    elsewhere = chosen_splits(path) if path else None
    for m in cfg.grid.models:
        for p in (str(p) for p in cfg.grid.precisions):
            if elsewhere is not None:
                here = any(pp == p and mm == m and rs
                           for (pp, mm, _), rs in runs.items())
                if here and (p, m) in elsewhere:
                    by_split[elsewhere[p, m]].append('{} {}'.format(m, p))
                continue
            sweep = [r for (pp, mm, mode), rs in runs.items()
                     if pp == p and mm == m and mode.startswith('fixed:')
                     for r in rs]
            if sweep:
                by_split[selection_split(sweep)].append('{} {}'.format(m, p))
    parts = []
    if by_split['validation']:
        parts.append('on the selection split of the training images '
                     '(data.val_size) for ' + ', '.join(by_split['validation']))
    if by_split['test']:
        parts.append('on the test images the table reports (runs without a '
                     'selection split: the choice and its score share '
                     'images, which favours Fixed) for '
                     + ', '.join(by_split['test']))
    return ('The held-out fixed scales were chosen ' + '; '.join(parts)
            + '.') if parts else ''


#: what chose the main table's Fixed (best) column (issue 47: the tables
#: say which images chose what): the best mean *test* accuracy of these
#: very runs, an in-sample oracle — never the selection split, and no
#: verdict is drawn against it (the paired tables use the held-out scale)
BEST_NOTE = (' Fixed (best) = the scale with the best mean final test '
             'accuracy over these runs: chosen on the test images it is '
             'scored on (in-sample, an upper bound for a fixed scale; no '
             'verdict uses it).')


def write_outputs(cfg, out, runs, left=()):
    folder = os.path.join(out, cfg.table)
    os.makedirs(folder, exist_ok=True)
    t1 = ('**Depth study: final test accuracy (%), Fashion-MNIST**\n\n'
          + table1(cfg, runs) + '\n\nmean ± sample std over seeds '
          '(n = finished runs); [k skipped] = mean skipped steps per run.'
          + (BEST_NOTE if any(mode.startswith('fixed:') and rs for
                              (_, _, mode), rs in runs.items()) else '')
          + '\n')
    t4 = ('**Fixed loss scale sweep per depth (Table 4 style)**\n\n'
          + table4(cfg, runs) + '\n')
    t1 += ('\n**Each method against the fixed scale chosen on the other '
           'seeds, paired by seed** (mean difference in points ± the half-'
           'width of its 95 % t interval; verdict: ahead / level / behind = '
           'the interval above / containing / below 0)\n\n'
           + paired(cfg, runs) + '\n')
    splits = split_note(cfg, runs)
    if splits:
        t1 += '\n' + splits + '\n'
    chosen = _chosen(cfg)
    if chosen is not None:
        t1 += ('\nThe fixed scales were chosen on other seeds ({}: the best '
               'mean there): {}.\n'.format(
                   cfg.study.choose_fixed_on, '; '.join(
                       '{} {} S={}'.format(m, p, chosen[p, m])
                       for m in cfg.grid.models
                       for p in (str(p) for p in cfg.grid.precisions)
                       if (p, m) in chosen) or 'none of this grid\'s'))
    recipes = recipe_paired(cfg, runs)
    if recipes:
        t1 += ('\n**Loss scaling inside the recipe (grad=loss) against the '
               'recipe\'s own gradient scaling (mode none), paired by '
               'seed**\n\n' + recipes + '\n')
    variants = variant_paired(cfg, runs)
    if variants:
        t1 += ('\n**Each part of a recipe: a precision with options (a part '
               'switched off or on) against its name alone, both with mode '
               'none, paired by seed**\n\n' + variants + '\n')
    options = option_paired(cfg, runs)
    if options:
        t1 += ('\n**Each option of a mode against the mode with its '
               'defaults, in the same precision, paired by seed**\n\n'
               + options + '\n')
    robust = robustness(cfg, runs)
    if robust:
        t1 += ('\n**Robustness: spread over seeds and runs that collapsed '
               '(ended > {:g} points below FP32) or diverged, with Wilson\'s '
               '95 % interval**\n\n'.format(COLLAPSE_POINTS) + robust + '\n')
    provenance = provenance_note(runs, cfg.train.batchsize)
    if provenance:
        t1 += '\n' + provenance + '\n'
    reused = sum(bool(r.get('reused')) for rs in runs.values() for r in rs)
    if reused:
        t1 += ('\n{} runs (none, fixed, dynamic) are the earlier edition\'s '
               '(study.reuse: {}).\n'.format(reused, cfg.study.reuse))
    if left:
        t1 += ('\n{} runs of study.reuse ({}) left out, their config not '
               'this one: {}.\n'.format(len(left), cfg.study.reuse, '; '.join(
                   '{} ({})'.format(n, why) for n, why in left[:4]) + (
                   '; …' if len(left) > 4 else '')))
    atomic.write_text(os.path.join(folder, 'table1.md'), t1)
    # the config these runs ran, for a later edition's study.reuse
    atomic.write_text(os.path.join(folder, R.CONFIG_YAML), C.dump(cfg))
    atomic.write_text(os.path.join(folder, 'table4.md'), t4)
    atomic.write_text(os.path.join(folder, 'results.json'), json.dumps(
        {'{}|{}|{}'.format(*k): [{key: r.get(key) for key in (
            'seed', 'status', 'final_test_accuracy', 'final_val_accuracy',
            'skipped_steps', 'skipped_by_layer', 'wall_time_s', 'reused',
            'git_commit', 'config_sha256', 'config_differs',
            'mode_resolved') if key in r}
            for r in v] for k, v in sorted(runs.items())},
        indent=1))
    return t1, t4


#: the one instance the entry runs
STUDY = DepthStudy()
