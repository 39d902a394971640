"""The GPT table (issue 48, item 6): a character-level GPT on the King James
Bible trained in every precision and loss-scaling mode; validation loss in
nats per character, paired by seed against FP32.

A cell is (precision, mode, seed); the grid is ``grid.rows``, each a set of
precisions × modes (+ ``fixed:S`` for each of its ``fixed_scales``), so
that FP32, BF16, mixed16, the FP8 modes and the scaled recipes share one
config without a full cross product. A run lives in
``<out>/<table>/<precision>-<mode>-s<seed>/`` (``:`` and ``,`` made ``_``).

One run (the recipe of :class:`ada_loss.experiment.recipe.TrainingStudy`
with this study's hooks):

* **data** (:mod:`ada_loss.datasets.char_corpus`, docs/transformer.md
  "Data"): the KJV text (:func:`ada_loss.datasets.kjv.get_kjv`), its
  train / select / val split; the training windows of the run's seed
  (:func:`~ada_loss.datasets.char_corpus.train_offsets` for
  ``train.max_iterations`` steps), read in order by a
  :class:`~ada_loss.experiment.iterators.WindowIterator` -- the same
  tokens in the same order for every method of a seed --, and the fixed
  evaluation batches of ``select`` and ``val`` (the same for every run);
* **model**: :class:`ada_loss.models.gpt.GPT` in the run's precision
  (:class:`ada_loss.training.LanguageModel`); the defaults match the peer
  (``scripts/gpt_torch_peer.py``): 4 layers, 4 heads, width 128, block 64,
  the readout tied to the token embedding, no biases (Linear or
  LayerNorm), no dropout;
* **optimizer**: Chainer's AdamW (betas 0.9, 0.99, eps 1e-8) with FP32
  master weights in mixed16 (:func:`setup_optimizer`); Chainer's update
  rule divides each parameter's gradient by its loss scale before Adam
  sees it, so the update is the unscaled one in every mode. The decoupled
  weight decay (0.1) acts on the 2-D weights only (embeddings, Linear
  weights), not on LayerNorm scales (the peer's groups);
* **schedule**: :class:`ada_loss.training.extensions.WarmupCosine`, the
  peer's (nanoGPT's) warm-up and cosine, as AdamW's ``eta``;
* **evaluation**: the mean loss over the fixed ``val`` batches
  (``validation/main/loss``) and ``select`` batches (``select/main/loss``)
  every ``log.eval_interval`` and at the end; ``run.json`` holds
  ``final_val_loss``, ``final_select_loss``, ``final_train_loss`` and
  ``unigram_val_loss`` (the loss of the training split's character
  frequencies, no context: what a collapsed model scores).

The table (:func:`table`): per method the validation loss (mean and 95 %
interval over seeds), its difference from FP32 paired by seed two ways
(issue 47, item 2): over the seeds where both finished (a pair with a
diverged side dropped) and over the seeds where both ended, a diverged run
scored at its ``unigram_val_loss`` (:func:`differences_scored`); the
verdict is the second's, Holm-adjusted over the table's rows
(:mod:`ada_loss.experiment.verdicts`); and the collapse rate (diverged, or
a final validation loss no better than ``unigram_val_loss``). The fixed
scales of a precision enter as one row, "fixed (held-out)": for each seed
the scale with the lowest mean ``select`` loss over the *other* seeds,
scored on that seed's ``val`` loss -- chosen neither on the reported split
nor on the seed it is scored on. After them, one row per entry of
``peers``: the independent PyTorch peer's runs, read from its JSON files
and checked before they are pooled
(:mod:`~ada_loss.experiment.studies.gpt_peers`), paired with our FP32 by
seed, outside the Holm family (another implementation, not a mode of this
one).
"""
import collections
import dataclasses
import json
import math
import os
from typing import List, Optional

import chainer
import numpy

from ada_loss import atomic
from ada_loss.datasets import char_corpus
from ada_loss.datasets.kjv import get_kjv, kjv_path
from ada_loss.experiment import config as C
from ada_loss.experiment import provenance
from ada_loss.experiment import recipe as RC
from ada_loss.experiment import runinfo as R
from ada_loss.experiment import settings
from ada_loss.experiment import summaries
from ada_loss.experiment import trainer_extensions
from ada_loss.experiment import verdicts as V
from ada_loss.experiment.mode_history import (
    constant_alpha_note, ran_with_constant_alpha)
from ada_loss.experiment.studies import gpt_peers
from ada_loss.experiment.config import section, setting
from ada_loss.experiment.iterators import WindowIterator, make_iterator
from ada_loss.experiment.modes import mode_slug
from ada_loss.models.gpt import GPT
from ada_loss.precision import PRECISION_HELP, dtype_config, parse_precision
from ada_loss.scaling import parse_mode, resolve_precision
from ada_loss.training import LanguageModel
from ada_loss.training.extensions import WarmupCosine
from ada_loss.training.precision_setup import setup_optimizer
from ada_loss.training.triggers import StopAt


# -- the config ----------------------------------------------------------------------
class Rows(object):
    """``grid.rows``: a list of ``{precisions: [...], modes: [...],
    fixed_scales: [...]}`` (``fixed_scales`` optional): each precision
    with each mode and each ``fixed:S``."""
    expected = ('a list of mappings {precisions: [...], modes: [...], '
                'fixed_scales: [...]}')
    KEYS = ('precisions', 'modes', 'fixed_scales')

    @staticmethod
    def parse(value, key):
        if not isinstance(value, list) or not value:
            C.fail(key, Rows.expected, value)
        out = []
        for i, row in enumerate(value):
            rkey = '{}[{}]'.format(key, i)
            if not isinstance(row, dict) or set(row) - set(Rows.KEYS) or \
                    'precisions' not in row or not (
                        row.get('modes') or row.get('fixed_scales')):
                C.fail(rkey, Rows.expected, row)
            precisions = [str(C.PrecisionName.parse(p, rkey + '.precisions'))
                          for p in _listed(row['precisions'],
                                           rkey + '.precisions')]
            modes = [str(C.Mode.parse(m, rkey + '.modes'))
                     for m in _listed(row.get('modes') or [], rkey + '.modes')]
            scales = [C.FixedScale.parse(s, rkey + '.fixed_scales')
                      for s in _listed(row.get('fixed_scales') or [],
                                       rkey + '.fixed_scales')]
            for s in scales:
                mode = str(parse_mode('fixed:{!r}'.format(s)))
                if mode not in modes:
                    modes.append(mode)
            for p in precisions:
                for m in modes:
                    try:
                        resolve_precision(m, p)
                    except ValueError as e:
                        raise C.ConfigError(rkey, str(e))
            out.append({'precisions': precisions, 'modes': modes})
        return out


def _listed(value, key):
    if not isinstance(value, list):
        C.fail(key, 'a list', value)
    return value


@dataclasses.dataclass
class Grid:
    rows: Rows = setting(
        [{'precisions': ['float32'], 'modes': ['fp32']}],
        'precisions x modes (+ fixed:S per fixed_scales) per row: '
        + Rows.expected)
    seeds: List[int] = setting([0, 1, 2], 'random seeds (one run each: '
                               'initialization and training windows)',
                               minimum=0)


@dataclasses.dataclass
class Model:
    n_layer: int = setting(4, 'transformer blocks', minimum=1)
    n_head: int = setting(4, 'attention heads', minimum=1)
    n_embd: int = setting(128, 'width', minimum=1)
    block_size: int = setting(64, 'context length (characters)', minimum=1)
    tie_weights: bool = setting(True, 'readout tied to the token embedding '
                                "(nanoGPT's and the peer's)")
    bias: bool = setting(False, 'biases in Linear and LayerNorm (false: '
                         "nanoGPT's bias=False, the peer's)")
    attention_stat: str = setting('tensor', "Algorithm 4's statistic of "
                                  "attention's GEMMs: tensor or head")
    attention_format: Optional[C.FormatName] = setting(
        None, "a format attention's two GEMMs keep whatever the precision "
        "(e.g. bfloat16; null: the precision's)")


@dataclasses.dataclass
class Data:
    kjv_root: Optional[str] = setting(
        None, 'folder of kjv.txt, or the text file (null: '
        '$ADA_LOSS_KJV_ROOT); made with `bible` when missing')
    eval_iters: int = setting(char_corpus.EVAL_ITERS, 'fixed evaluation '
                              'batches per split (select, val)', minimum=1)


@dataclasses.dataclass
class Train:
    batchsize: int = setting(12, 'windows per step', minimum=1)
    max_iterations: int = setting(2000, 'training steps', minimum=1)
    lr: float = setting(1e-3, 'peak learning rate (AdamW alpha)',
                        positive=True)
    min_lr: float = setting(1e-4, 'learning rate at the end of the cosine',
                            minimum=0.0)
    warmup_iterations: int = setting(100, 'linear warm-up steps',
                                     minimum=0)
    lr_decay_iterations: int = setting(2000, 'step where the cosine reaches '
                                       'min_lr', minimum=1)
    beta1: float = setting(0.9, 'AdamW beta1', minimum=0.0)
    beta2: float = setting(0.99, 'AdamW beta2', minimum=0.0)
    eps: float = setting(1e-8, 'AdamW eps', positive=True)
    weight_decay: float = setting(0.1, 'decoupled weight decay of the 2-D '
                                  'weights (PyTorch AdamW\'s: lr(i) * wd)',
                                  minimum=0.0)


@dataclasses.dataclass
class GPTLog(settings.Log):
    log_interval: C.Interval = settings.log_setting('log_interval',
                                                    [50, 'iteration'])
    eval_interval: C.Interval = settings.log_setting('eval_interval',
                                                     [250, 'iteration'])
    snapshot_interval: C.Interval = settings.log_setting(
        'snapshot_interval', [250, 'iteration'])


@dataclasses.dataclass
class Config:
    """The config of the GPT table."""
    table: str = setting('gpt', 'results subfolder: <out>/<table>/<run>/')
    description: str = setting('', 'free text, copied to every run')
    blas_threads: int = setting(1, 'BLAS/OpenMP threads of each run',
                                minimum=1)
    device: Optional[C.Device] = settings.device_setting()
    grid: Grid = section(Grid)
    model: Model = section(Model)
    data: Data = section(Data)
    train: Train = section(Train)
    log: GPTLog = section(GPTLog)
    peers: gpt_peers.Peers = setting(
        [], 'rows of the independent peer (scripts/gpt_torch_peer.py): '
        'its JSON files, read and checked by the table, never trained')

    def check(self):
        if self.model.attention_stat not in ('tensor', 'head'):
            raise C.ConfigError('model.attention_stat', 'expected tensor '
                                'or head, got {!r}'.format(
                                    self.model.attention_stat))
        if self.model.n_embd % self.model.n_head:
            raise C.ConfigError('model.n_embd', 'expected a multiple of '
                                'model.n_head ({}), got {}'.format(
                                    self.model.n_head, self.model.n_embd))
        if self.train.warmup_iterations > self.train.lr_decay_iterations:
            raise C.ConfigError('train.warmup_iterations', 'expected at '
                                'most train.lr_decay_iterations ({})'.format(
                                    self.train.lr_decay_iterations))
        for i, row in enumerate(self.grid.rows):
            settings.check_modes_build(
                [('grid.rows[{}].modes'.format(i), parse_mode(m))
                 for m in row['modes']], set(row['precisions']))


class AdamW(chainer.optimizers.AdamW):
    """Chainer's AdamW whose ``lr`` (what ``observe_lr`` logs) is the
    scheduled rate ``alpha * eta`` of the step. Chainer's own ``lr`` is the
    bias-corrected ``alpha_t``, and raises before the first update: a run
    whose first step is skipped (an overflow under a loss scale) would end
    in an error instead of being logged."""

    @property
    def lr(self):
        return self.alpha * self.eta


# -- the study -----------------------------------------------------------------------
Cell = collections.namedtuple('Cell', ('precision', 'mode', 'seed'))

PRINT_KEYS = ['iteration', 'main/loss', 'validation/main/loss',
              'select/main/loss', 'lr', 'loss_scale',
              'skipped_steps',
              'elapsed_time']
PLOTS = [('Loss', ['main/loss', 'validation/main/loss',
                   'select/main/loss'])]


def slug(text):
    return str(text).replace(':', '_').replace(',', '_')


def run_name(cell):
    return '{}-{}-s{}'.format(slug(cell.precision), mode_slug(cell.mode),
                              cell.seed)


def unigram_loss(corpus, split='val'):
    """The cross-entropy (nats per character) of ``split`` under the
    training split's character frequencies (add-one smoothed): a model
    that learned no context."""
    counts = numpy.bincount(corpus.splits['train'],
                            minlength=corpus.vocab_size) + 1.0
    logp = numpy.log(counts / counts.sum())
    return float(-logp[corpus.splits[split]].mean())


class GPTStudy(RC.TrainingStudy):
    """The GPT table of issue 48."""
    Config = Config
    Cell = Cell
    help_notes = ['', 'precisions (grid.rows[].precisions): ' +
                  PRECISION_HELP]
    print_keys = PRINT_KEYS
    plots = PLOTS
    records_epoch = False
    final_what = 'validation loss'
    stop_keys = ('train.max_iterations',)

    def cells(self, cfg):
        """Seed-major (a partial grid holds complete seeds), then the rows
        in their order; a cell listed twice runs once."""
        out = []
        for s in cfg.grid.seeds:
            for row in cfg.grid.rows:
                for p in row['precisions']:
                    for m in row['modes']:
                        cell = Cell(parse_precision(p), parse_mode(m), s)
                        if cell not in out:
                            out.append(cell)
        return out

    def run_name(self, cfg, cell):
        return run_name(cell)

    def run_config(self, cfg, cell):
        out = {'run': {'precision': str(cell.precision),
                       'mode': str(cell.mode), 'seed': cell.seed}}
        # the grid and the peer rows are the table's, not a run's
        out.update((k, v) for k, v in C.to_dict(cfg).items()
                   if k not in ('grid', 'peers'))
        return out

    def data_record(self, cfg, cell):
        path = kjv_path(cfg.data.kjv_root)
        if not os.path.isfile(path):
            return None
        return provenance.data_record({'data.kjv_root': path}, [path])

    def preload(self, cfg, cells):
        """The corpus (made with ``bible`` if missing; one clear error if
        it cannot be) and its unigram baseline."""
        return self._load(cfg)

    def _load(self, cfg):
        corpus = get_kjv(cfg.data.kjv_root)
        return {'corpus': corpus, 'unigram': unigram_loss(corpus)}

    # -- the recipe's hooks ---------------------------------------------------------
    def setup(self, cfg, cell, comm=None):
        if comm is not None:
            raise C.ConfigError('distributed', 'the GPT table runs in one '
                                'process (no ChainerMN)')
        return RC.Run(cfg=cfg, cell=cell, config=cfg, mode=cell.mode,
                      precision=RC.run_precision(cell.mode, cell.precision),
                      seed=cell.seed, log=cfg.log)

    def run_fields(self, run):
        cell = run.cell
        return [('name', run_name(cell)), ('table', run.cfg.table)] + \
            RC.mode_fields(run.mode, run.precision) + [
                ('seed', cell.seed), ('precision', str(run.precision))]

    def load_data(self, run, cache):
        data = cache or self._load(run.cfg)
        run.corpus = data['corpus']
        run.unigram = data['unigram']
        return data

    def model(self, run, data):
        m = run.config.model
        with dtype_config(run.precision):
            gpt = GPT(run.corpus.vocab_size, m.n_layer, m.n_head, m.n_embd,
                      m.block_size, tie_weights=m.tie_weights,
                      attention_stat=m.attention_stat,
                      attention_format=m.attention_format and str(
                          m.attention_format),
                      bias=m.bias)
        return LanguageModel(gpt, run.precision, run.seed)

    def eval_examples(self, run, split):
        """The fixed evaluation windows of ``split``, as examples in batch
        order."""
        block = run.config.model.block_size
        xs, ys = [], []
        for x, y in run.corpus.eval_batches(split, block,
                                            run.config.train.batchsize,
                                            run.config.data.eval_iters):
            xs.extend(x)
            ys.extend(y)
        return list(zip(xs, ys))

    def datasets(self, run, data, model):
        run.select = self.eval_examples(run, 'select')
        return None, self.eval_examples(run, 'val')

    def optimizer(self, run, model):
        t = run.config.train
        # eta carries the schedule (WarmupCosine); the decay rate is
        # lr * wd so that eta * rate = lr(i) * wd, PyTorch AdamW's
        opt = AdamW(
            alpha=t.lr, beta1=t.beta1, beta2=t.beta2, eps=t.eps, eta=1.0,
            weight_decay_rate=t.lr * t.weight_decay)
        setup_optimizer(opt, model, run.precision)
        for param in model.params():
            if param.ndim != 2:     # LayerNorm scales (and biases)
                param.update_rule.hyperparam.weight_decay_rate = 0.0
        return opt

    def batchsize(self, run):
        return run.config.train.batchsize

    def iterators(self, run, train, test, batchsize):
        t = run.config.train
        block = run.config.model.block_size
        ids = run.corpus.splits['train']
        offsets = char_corpus.train_offsets(len(ids), block, batchsize,
                                            t.max_iterations, run.seed)
        return (WindowIterator(ids, offsets, block),
                make_iterator(test, batchsize, repeat=False, shuffle=False))

    def stop(self, run):
        return StopAt(iterations=run.config.train.max_iterations)

    def lr_schedule(self, run, optimizer):
        t = run.config.train
        return WarmupCosine(t.lr, t.min_lr, t.warmup_iterations,
                            t.lr_decay_iterations, attr='eta',
                            optimizer=optimizer)

    def _evaluator(self, run, model, examples, name):
        it = make_iterator(examples, run.config.train.batchsize,
                           repeat=False, shuffle=False)
        ev = trainer_extensions.evaluator(it, model, None, run.device)
        ev.name = name
        return ev

    def extend(self, run, trainer):
        model = trainer.updater.get_optimizer('main').target
        every = trainer_extensions.interval_triggers(run.log,
                                                     trainer.stop_trigger)
        trainer.extend(self._evaluator(run, model, run.select, 'select'),
                       name='select', trigger=every('eval_interval'))


    def final_values(self, run, trainer, updater):
        """The validation and selection losses of the trained model (every
        fixed batch, computed now: also right after a resume)."""
        model = trainer.updater.get_optimizer('main').target
        val = self._evaluator(run, model, self.eval_examples(run, 'val'),
                              'validation')()['validation/main/loss']
        sel = self._evaluator(run, model, run.select,
                              'select')()['select/main/loss']
        run.final = (float(val), float(sel))
        return [('val', run.final[0]), ('select', run.final[1])]

    def metrics(self, run, trainer, updater, diverged):
        val, sel = getattr(run, 'final', (None, None))
        ok = not diverged
        return [('final_val_loss', val if ok else None),
                ('final_select_loss', sel if ok else None),
                ('final_train_loss', summaries.last(
                    trainer.get_extension('LogReport').log, 'main/loss')),
                ('unigram_val_loss', run.unigram),
                ('corpus_sha256', run.corpus.sha256)]

    def summary(self, info):
        text = '{:<48s} {:<9s}'.format(info['name'], info['status'])
        if info.get('final_val_loss') is not None:
            text += ' val {:.4f} select {:.4f}'.format(
                info['final_val_loss'], info['final_select_loss'])
        text += ' skipped {:d}, {:d} it, {:.1f} s'.format(
            info.get('skipped_steps') or 0, info.get('iterations') or 0,
            info.get('wall_time_s') or 0.0)
        if info['status'] == R.DIVERGED and info.get('error'):
            text += '\n      ' + info['error'].split('. ')[0]
        return text

    def write_tables(self, cfg, out, quiet=False, train=True):
        runs = collect(self, cfg, out)
        rows = results(cfg, runs)       # raises TableRefused (peer files)
        text = render(rows)
        folder = os.path.join(out, cfg.table)
        if os.path.isdir(folder):
            atomic.write_text(os.path.join(folder, 'table.md'), text)
            atomic.write_text(os.path.join(folder, 'results.json'),
                              json.dumps(rows, indent=1,
                                         sort_keys=True) + '\n')
        if not quiet:
            print(text)
        return text


# -- the table -----------------------------------------------------------------------
def collect(study, cfg, out):
    """{(precision, mode): {seed: run.json dict}} of the runs there."""
    runs = collections.defaultdict(dict)
    for cell in study.cells(cfg):
        info = R.read_run(study.folder(out, cfg, cell))
        if info:
            runs[(str(cell.precision), str(cell.mode))][cell.seed] = info
    return runs


def ended(info):
    return info.get('status') in (R.FINISHED, R.DIVERGED)


def val_loss(info):
    """The final validation loss of a finished run, else None."""
    if info.get('status') != R.FINISHED:
        return None
    v = info.get('final_val_loss')
    return v if v is not None and math.isfinite(v) else None


def collapsed(info, unigram=None):
    """Diverged, or no better than the character frequencies (the run's
    ``unigram_val_loss``, else ``unigram``: a peer's run records none)."""
    v = val_loss(info)
    u = info.get('unigram_val_loss')
    u = unigram if u is None else u
    return v is None or v >= (math.inf if u is None else u)


def held_out_fixed(by_mode):
    """({seed: run}, {seed: S}) of the fixed scales of one precision
    (``by_mode``: {mode: {seed: run}}): for each seed the scale whose mean
    ``final_select_loss`` over the other seeds is lowest (a run that did
    not finish counts as infinite), scored on this seed."""
    sweep = {m: rs for m, rs in by_mode.items()
             if parse_mode(m).name == 'fixed'}
    seeds = sorted({s for rs in sweep.values() for s in rs})
    chosen, scales = {}, {}
    for seed in seeds:
        best = None
        for mode, rs in sorted(sweep.items()):
            others = [rs[s] for s in seeds if s != seed and s in rs]
            if seed not in rs or len(others) < len(seeds) - 1 or \
                    not others or not all(ended(r) for r in others):
                continue
            mean = numpy.mean([
                r['final_select_loss'] if val_loss(r) is not None
                and r.get('final_select_loss') is not None else math.inf
                for r in others])
            if best is None or mean < best[0]:
                best = (mean, mode)
        if best is not None:
            chosen[seed] = sweep[best[1]][seed]
            scales[seed] = parse_mode(best[1]).options['scale']
    return chosen, scales


def methods(cfg, runs):
    """``[(label, {seed: run})]`` in the config's order: each (precision,
    mode), the fixed scales of a precision as one held-out row."""
    out, seen = [], set()
    for row in cfg.grid.rows:
        for p in row['precisions']:
            for m in row['modes']:
                if parse_mode(m).name == 'fixed':
                    if (p, 'fixed') in seen:
                        continue
                    seen.add((p, 'fixed'))
                    by_mode = {mm: rs for (pp, mm), rs in runs.items()
                               if pp == p}
                    chosen, scales = held_out_fixed(by_mode)
                    label = '{} fixed (held-out; S = {})'.format(
                        p, ', '.join('{:g}'.format(scales[s])
                                     for s in sorted(scales)) or '–')
                    out.append((label, chosen))
                elif (p, m) not in seen:
                    seen.add((p, m))
                    out.append(('{} {}'.format(p, m), runs.get((p, m), {})))
    return out


def reference(runs):
    """{seed: run} of FP32 (mode fp32)."""
    return runs.get(('float32', 'fp32'), {})


def differences(mine, ref):
    """Paired differences of validation loss (mine − FP32) over the seeds
    where both finished: a pair with a diverged side is dropped (which
    side diverged then decides what is hidden: issue 47)."""
    out = []
    for seed, r in sorted(mine.items()):
        a, b = val_loss(r), val_loss(ref.get(seed, {}))
        if a is not None and b is not None:
            out.append(a - b)
    return out


def table_unigram(runs):
    """The table's ``unigram_val_loss`` (the value most of its runs record:
    one corpus gives one value), None where no run records one."""
    values = [r.get('unigram_val_loss') for rs in runs.values()
              for r in rs.values() if r.get('unigram_val_loss') is not None]
    if not values:
        return None
    return collections.Counter(values).most_common(1)[0][0]


def scored_loss(info, unigram):
    """A run's final validation loss with a failure scored at the unigram
    loss (the GPT's analogue of chance, issue 47): the run's own
    ``unigram_val_loss``, else ``unigram``. A run that diverged -- or, the
    same failure, finished without a finite validation loss -- scores
    that; a run that has not ended (running, interrupted, absent) is
    None: no pair."""
    if not ended(info):
        return None
    v = val_loss(info)
    if v is not None:
        return v
    u = info.get('unigram_val_loss')
    return unigram if u is None else u


def differences_scored(mine, ref, unigram):
    """Paired differences (mine − FP32) over the seeds where both runs
    ended, a diverged run scored at the unigram loss (:func:`scored_loss`;
    where it records none, the FP32 run's of that seed, else ``unigram``,
    the table's): every failure counts against the side that failed. A
    pair neither side of which can be scored (no unigram anywhere) is
    left out."""
    out = []
    for seed, r in sorted(mine.items()):
        theirs = ref.get(seed, {})
        u = theirs.get('unigram_val_loss')
        a = scored_loss(r, unigram if u is None else u)
        b = scored_loss(theirs, unigram)
        if a is not None and b is not None:
            out.append(a - b)
    return out


def _interval(p):
    if p.n == 0:
        return '–'
    if p.half_width is None:
        return '{:+.3f} (n={})'.format(p.mean, p.n)
    return '{:+.3f} ± {:.3f} (n={})'.format(p.mean, p.half_width, p.n)


def _mean(p):
    return _interval(p).lstrip('+') if p.n else '–'


VERDICT_WORDS = {'ahead': 'worse', 'behind': 'better'}


def _row(label, by_seed, ref, unigram, peer=False):
    done = [r for r in by_seed.values() if ended(r)]
    losses = [val_loss(r) for r in done if val_loss(r) is not None]
    # the reference is not tested against itself (nor counted by Holm)
    own = by_seed is ref
    return {
        'method': label, 'peer': peer, 'runs': len(by_seed),
        'ended': len(done), 'val_loss': V.paired(losses),
        'difference': V.paired([] if own else differences(by_seed, ref)),
        'difference_scored': V.paired(
            [] if own else differences_scored(by_seed, ref, unigram)),
        'collapsed': sum(collapsed(r, unigram) for r in done)}


def results(cfg, runs):
    """The table's numbers: a list of dicts, one per method, then one per
    peer (``cfg.peers``, :mod:`~ada_loss.experiment.studies.gpt_peers`;
    raises :class:`~ada_loss.experiment.runner.TableRefused` for a peer
    file that does not belong). ``difference``: pairs with a failed side
    dropped; ``difference_scored``: failures scored at the unigram loss,
    whose verdict is the row's (``raw_verdict``) and, over this
    implementation's rows only, Holm's (``verdict``; None for a peer)."""
    ref = reference(runs)
    unigram = table_unigram(runs)
    rows = []
    # the loss gradient's rows: every token of a step's windows
    tokens = cfg.train.batchsize * cfg.model.block_size
    for label, by_seed in methods(cfg, runs):
        row = _row(label, by_seed, ref, unigram)
        # seeds that ran adaptive's old default α_{N+1} = 1 where today's
        # (init_scale=format) would not (a footnote: render)
        row['constant_alpha'] = sorted(
            seed for seed, r in by_seed.items() if ran_with_constant_alpha(
                r, r.get('mode'), r.get('precision'), tokens))
        rows.append(row)
    # the peers answer another question (does an independent
    # implementation agree; unit scaling at its own learning rate), not
    # "does this precision or mode change our GPT's loss": kept out of
    # the family, they leave the Holm verdicts of our rows as they are
    peers = gpt_peers.rows(cfg, runs)
    for label, peer_runs, info in peers:
        row = _row(label, peer_runs, ref, unigram, peer=True)
        row.update(info)
        row['seeds'] = sorted(peer_runs)
        rows.append(row)
    family = [r['difference_scored'] for r in rows if not r['peer']]
    holm = iter(V.holm_verdicts(family))
    for r in rows:
        v = r['difference_scored'].verdict
        r['raw_verdict'] = VERDICT_WORDS.get(v, v)
        r['in_holm'] = not r['peer'] and \
            r['difference_scored'].p_value is not None
        v = None if r['peer'] else next(holm)
        r['verdict'] = VERDICT_WORDS.get(v, v)
        for k in ('val_loss', 'difference', 'difference_scored'):
            r[k] = r[k]._asdict()
    return rows


HEADER = ('Validation loss (nats/char) on the fixed `val` batches; Δ: '
          'paired by seed against FP32 (float32 fp32), 95 % t intervals, '
          'first over the seeds where both finished (pairs with a diverged '
          'side dropped), then over the seeds where both ended with a '
          'diverged run scored at the unigram loss (the training split\'s '
          'character frequencies: a model that learned no context); the '
          'verdict is the second\'s, Holm-adjusted over this '
          'implementation\'s rows (worse / better / level); collapsed: '
          'diverged or no better than the unigram loss (Wilson 95 %).')


def _peer_note(r):
    """The footnote of one peer row: its files, what it was checked
    against, the settings it does not share with the table."""
    seeds = ', '.join(str(s) for s in r['seeds'])
    text = '- {}: {} (seed{} {})'.format(
        r['method'], ', '.join('`{}`'.format(f) for f in r['files']),
        '' if len(r['seeds']) == 1 else 's', seeds)
    if not r['corpus_checked']:
        text += '; corpus NOT checked (no run here records corpus_sha256)'
    if r['settings_differ']:
        text += '; unlike this table: ' + ', '.join(
            '{} {!r} (table {!r})'.format(k, v['peer'], v['table'])
            for k, v in sorted(r['settings_differ'].items()))
    return text + '.'


def render(rows):
    """The markdown table of :func:`results`' rows (peer rows last, each
    with its footnote)."""
    lines = [HEADER, '',
             '| method | runs | val loss | Δ vs FP32, pairs dropped | '
             'Δ vs FP32, diverged at unigram | Holm | collapsed |',
             '|---|---|---|---|---|---|---|']
    for r in rows:
        val = V.Paired(**r['val_loss'])
        if r['peer']:
            verdict = '{} (raw; peer, outside Holm)'.format(
                r['raw_verdict']) if r['raw_verdict'] else '– (peer)'
        else:
            verdict = r['verdict'] or '–'
        lines.append('| {} | {}/{} | {} | {} | {} | {} | {} |'.format(
            r['method'], r['ended'], r['runs'], _mean(val),
            _interval(V.Paired(**r['difference'])),
            _interval(V.Paired(**r['difference_scored'])), verdict,
            V.rate_text(r['collapsed'], r['ended'])))
    constant = ['{} seed {}'.format(r['method'], seed) for r in rows
                for seed in r.get('constant_alpha') or ()]
    if constant:
        lines += ['', constant_alpha_note(constant)]
    peers = [r for r in rows if r['peer']]
    if peers:
        lines += ['', 'Peer rows: runs of the independent PyTorch peer '
                  '(`scripts/gpt_torch_peer.py`, no code of ada_loss), read '
                  'from its JSON files; each file checked against this '
                  'table (model shape, batch, steps, evaluation batches) '
                  'and the text of our runs (`corpus_sha256`) before it is '
                  'pooled. Their Δ is against our FP32 run of the same '
                  'seed. They are outside the Holm family: they test '
                  'another implementation (and unit scaling, another '
                  'method at its own learning rate), not a precision or '
                  'mode of ours, so their verdict is the raw interval\'s.']
        lines += [_peer_note(r) for r in peers]
    return '\n'.join(lines) + '\n'


def table(cfg, runs):
    """The markdown table of :func:`results`."""
    return render(results(cfg, runs))


#: the one instance the entry runs
STUDY = GPTStudy()
