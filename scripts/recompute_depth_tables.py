"""Every cell of a depth study's tables recomputed from its per-run files,
by code that shares nothing with the tables' own (issue 47: an audit's
check). It imports the standard library, NumPy, SciPy and PyYAML (to read
``config.yaml``) only — nothing of ``ada_loss`` — and works from the definitions written out below, not from
the table code (``ada_loss/experiment/studies/depth.py``).

    python scripts/recompute_depth_tables.py FOLDER [FOLDER ...] [-v]

A FOLDER is a table folder: ``table1.md`` and/or ``table4.md``, with the
runs in ``<precision>/<run>/run.json`` (the per-run files, read first)
and/or ``results.json`` (``{"precision|model|mode": [run, ...]}``; where
both are there, results.json says which runs the tables gathered and each
of its runs is checked against its run.json, and its ``config_sha256``
against the run's config.yaml). Each cell that differs is
printed (file, table, row, column, printed and recomputed); the exit status
is 1 if any differs, 2 on bad input, else 0, with the number of cells
checked.

**Definitions** (accuracies in points: 100 × ``final_test_accuracy``; a run
*has an accuracy* when its status is ``finished`` and the accuracy is not
null; a run *ended* when its status is ``finished`` or ``diverged``):

* a cell of runs: mean ± sample std (ddof 1) over the runs with an
  accuracy, '{:.2f} ± {:.2f}' (the ± part only for two or more), then the
  cell's note, then ' (n=N)' when N > 1 or any diverged (', k diverged'
  inside), then ' [x skipped]' (x = mean ``skipped_steps`` over the runs
  that ended, '{:g}' of x rounded to 0.1) when x is not 0; no run with an
  accuracy: 'diverged (k)', or '—' when none diverged either;
* Fixed (best): the fixed scale with the best mean among those none of
  whose runs diverged, note ' (S=s)';
* Fixed (held-out): for each seed, the candidates are the fixed scales
  with a run on that seed whose runs on all other seeds (at least one) have
  an accuracy; the chosen one has the highest mean over the other seeds
  (a tie: the smallest scale), and its run on this seed is scored; note
  ' (S=a/b/...)', the chosen scale per seed in seed order. The means and
  the candidates' accuracies are of ``final_val_accuracy`` (the selection
  split of the training images) where every finished fixed run of that
  depth and precision recorded one, else of the test accuracy; the line
  'The held-out fixed scales were chosen ...' must name each depth and
  precision under the split this rule gives. With a line 'The fixed scales
  were chosen on other seeds (FILE: ...)' in table1.md, the scale is
  instead the one with the best mean in FILE (by the same rule, over its
  scales with an accuracy on every run), scored on every seed here, and
  the split line must name, for each depth and precision with runs here
  that FILE chose a scale for, the split FILE's runs chose on;
* paired tables (rows: depth, precision, method; compared with the held-out
  fixed scale, or for a ``grad=loss`` precision the same precision without
  it in mode none ('Recipe'), or for a precision with options the name
  with its ``recipe=`` only in mode none ('Full recipe'), or for a mode
  with options its name alone in the same precision ('Mode default')):
  *pairs dropped* = the differences over the seeds where both runs have an
  accuracy; *diverged at chance* = over the seeds where both ended, a run
  without an accuracy scored at chance (10 points: ten classes, as in
  Fashion-MNIST and CIFAR-10; ``--chance`` for another). Text
  '+m ± h (n=N)', h the half-width of the 95 % Student t interval
  (t_{0.975, N−1} · sd / √N), '+m (n=1)', '–' for none. verdict: ahead /
  behind / level as the interval lies above / below / across 0 ('n < 2'
  for one seed), from the chance-scored differences (from the dropped ones
  in tables that have no chance column: the earlier format); Holm: the
  two-sided one-sample t-test p-values of the chance-scored differences of
  the table's rows with N ≥ 2, Holm's step-down at 0.05, a rejected row
  'ahead' or 'behind' by its mean's sign, else 'level' ('—' for N < 2);
  ahead: 'k/N' seeds with a positive difference; a row with no pair says
  'no seed where both ended';
* robustness: per depth, precision and mode, k/n over the runs that ended,
  k counting those without an accuracy or more than 20 points below the
  FP32 run of the same seed (below the FP32 mean where that seed has
  none), with Wilson's 95 % interval '(lo–hi %)'; the held-out fixed
  scale has a row of its own ('Fixed (held-out)');
* table4.md: a cell of runs per fixed scale;
* 'Commits of the pooled runs': the runs counted by ``git_commit`` (its
  first 10 characters, 'unknown' where null);
* '**N pooled runs ran another config than this table's**': where the
  folder has its ``config.yaml`` (the table's config) and runs have theirs,
  each run's ``config.yaml`` against the table's for its depth (the table's
  sections, ``per_model[depth]`` merged into them; ``grid`` and
  ``per_model`` themselves aside), key by key (a missing key is null), but
  for :data:`NOT_COMPARED` (the run's own name, and what does not change
  its numbers); the line names each run that differs (``depth precision
  mode seed s (keys)``, the first 8, by precision, depth and mode, then
  seed), and there is no such line where none differs (checked in tables
  that have the commits line, which came with it);
* '**The pooled runs read different data files**': where the runs'
  ``run.json`` data records (their ``fingerprint``) name more than one data
  set, each fingerprint's first 10 characters with its runs (count, the
  first two); no such line otherwise.

Rows and columns are checked too: a comparison the runs make with no row,
a row or column with no runs.

A printed number matches when it is the recomputed one rounded to the
printed decimals (1e-9 of slack at a rounding tie: the two codes may sum
in another order); every other character must be equal.
"""
import argparse
import hashlib
import json
import math
import os
import re
import sys

import numpy
import yaml
from scipy import stats as scipy_stats

FINISHED, DIVERGED = 'finished', 'diverged'
#: a run without an accuracy, scored in points (ten classes)
CHANCE = 10.0
#: a run collapses when it ends more than this many points below FP32
COLLAPSE = 20.0
#: the family-wise level of Holm's procedure and of every interval
ALPHA = 0.05
#: a mode's column label by its name (fixed scales have columns of their
#: own); adaptive's options guard=false and style=authors have theirs
LABELS = {'fp32': 'FP32', 'none': 'None', 'dynamic': 'Dynamic',
          'adaptive': 'Adaptive', 'amax': 'Amax'}
DASHES = ('—', '–', '-')
#: slack at a rounding tie: the two codes may add in another order (a
#: difference near 1e-14 here), far below a changed last digit
TIE = 1e-9


#: dotted keys of a run's config.yaml not compared with the table's: the
#: run's own cell and names (run, table, layout, train.precision), free text
#: and what is logged or shown (description, log), how the data are fetched
#: (data.download, data.mirror) and the study's table-time settings
#: (study.reuse, .fig4, .fp32, .choose_fixed_on, .runs_from)
NOT_COMPARED = ('run', 'table', 'layout', 'train.precision', 'description',
                'log', 'data.download', 'data.mirror', 'study.reuse',
                'study.fig4', 'study.fp32', 'study.choose_fixed_on',
                'study.runs_from')


class BadInput(Exception):
    """A folder that is not a table folder (one line, exit status 2)."""


# -- runs -----------------------------------------------------------------
def _split_options(text):
    """('name', {option: value}) of 'name:a=1,b=2'."""
    name, _, rest = text.partition(':')
    opts = {}
    for o in rest.split(',') if rest else ():
        k, _, v = o.partition('=')
        # earlier runs spelt booleans as Python does (guard=False)
        opts[k] = v.lower() if v in ('True', 'False') else v
    return name, opts


def same_spec(a, b):
    """Two precision or mode texts naming the same thing (options in any
    order)."""
    return _split_options(a) == _split_options(b)


def label_of(mode):
    """A mode's column label (issue 39: two modes sharing one are each
    labelled by their text instead, see :func:`mode_columns`)."""
    name, opts = _split_options(mode)
    if name == 'adaptive' and opts.get('style') == 'authors':
        return 'Adaptive (authors)'
    if name == 'adaptive' and opts.get('guard') == 'false':
        return 'Adaptive (paper)'
    return LABELS.get(name, name)


def is_fixed(mode):
    return mode.startswith('fixed:')


def scale_of(mode):
    return float(mode.split(':', 1)[1])


def load_runs(folder):
    """({(precision, model, mode): [run dict]}, notes, mismatches) of a
    table folder. run.json files are the per-run record; where a
    results.json is there too, it names the runs the tables gathered and
    its values must equal the run.json's."""
    from_files = {}
    for prec in sorted(os.listdir(folder)):
        pdir = os.path.join(folder, prec)
        if not os.path.isdir(pdir):
            continue
        for name in sorted(os.listdir(pdir)):
            path = os.path.join(pdir, name, 'run.json')
            if not os.path.isfile(path):
                continue
            with open(path) as f:
                r = json.load(f)
            try:
                key = (r['precision'], r['model'], r['mode'], r['seed'])
            except KeyError as e:
                raise BadInput('{}: no {} in it'.format(path, e))
            from_files[key] = dict(r, _folder=os.path.dirname(path))
    notes, bad = [], []
    path = os.path.join(folder, 'results.json')
    if not os.path.isfile(path):
        if not from_files:
            raise BadInput('{}: expected results.json or <precision>/<run>/'
                           'run.json files; found neither'.format(folder))
        runs = {}
        for (p, m, mode, _), r in sorted(from_files.items(),
                                         key=lambda kv: kv[0][3]):
            runs.setdefault((p, m, mode), []).append(r)
        notes.append('{} runs from run.json files'.format(len(from_files)))
        return runs, notes, bad
    with open(path) as f:
        raw = json.load(f)
    runs, only_pooled = {}, 0
    for text, rs in raw.items():
        parts = text.split('|')
        if len(parts) != 3:
            raise BadInput('{}: key {!r} is not precision|model|mode'.format(
                path, text))
        key = tuple(parts)
        for r in rs:
            own = from_files.pop(key + (r['seed'],), None)
            if own is None:
                only_pooled += 1
                runs.setdefault(key, []).append(r)
                continue
            for field in ('status', 'final_test_accuracy', 'skipped_steps',
                          'final_val_accuracy'):
                if (field in r or field in own) and \
                        r.get(field) != own.get(field):
                    bad.append(('results.json', text, 'seed {} {}'.format(
                        r['seed'], field), repr(r.get(field)),
                        repr(own.get(field)) + ' (run.json)'))
            digest = config_sha256(own['_folder'])
            if r.get('config_sha256') and r['config_sha256'] != digest:
                bad.append(('results.json', text, 'seed {} config_sha256'
                            .format(r['seed']), r['config_sha256'],
                            '{} (sha256 of its config.yaml)'.format(digest)))
            runs.setdefault(key, []).append(own)
    used = sum(len(v) for v in runs.values()) - only_pooled
    notes.append('{} runs: {} from run.json, {} from results.json alone'
                 .format(used + only_pooled, used, only_pooled))
    if from_files:
        notes.append('{} run.json files not in results.json (not gathered '
                     'by the tables; left out): {}'.format(
                         len(from_files), ', '.join(
                             '|'.join(map(str, k)) for k in
                             sorted(from_files, key=str)[:4])
                         + (', …' if len(from_files) > 4 else '')))
    return runs, notes, bad


def config_sha256(run_folder):
    """The SHA-256 of a run folder's config.yaml, or None (none there)."""
    path = os.path.join(run_folder, 'config.yaml')
    if not os.path.isfile(path):
        return None
    with open(path, 'rb') as f:
        return hashlib.sha256(f.read()).hexdigest()


def read_config(path):
    """A config.yaml as a dict, or None (no such file)."""
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        try:
            return yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            raise BadInput('{}: not YAML ({})'.format(path, e))


def expected_run_config(table, model):
    """The config a run of ``model`` runs under a table's config: its
    sections with ``per_model[model]`` merged into them."""
    out = {k: v for k, v in table.items() if k not in ('grid', 'per_model')}
    for sec, values in ((table.get('per_model') or {}).get(model) or
                        {}).items():
        out[sec] = dict(out.get(sec) or {}, **values)
    return out


def differing_keys(a, b, prefix=''):
    """Dotted keys whose values differ between two nested dicts (a
    missing key is null), :data:`NOT_COMPARED` aside, sorted."""
    keys = []
    for k in set(a) | set(b):
        name = prefix + str(k)
        if any(name == n or name.startswith(n + '.') for n in NOT_COMPARED):
            continue
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            keys += differing_keys(x, y, name + '.')
        elif x != y:
            keys.append(name)
    return sorted(keys)


def lookup(runs, precision, model, mode):
    """The runs of a cell, the precision's and mode's options in any
    order; [] when there are none."""
    if (precision, model, mode) in runs:
        return runs[(precision, model, mode)]
    for (p, m, md), rs in runs.items():
        if m == model and same_spec(p, precision) and same_spec(md, mode):
            return rs
    return []


def by_seed(rs):
    return {r['seed']: r for r in rs}


def points(run, field='final_test_accuracy'):
    """A run's accuracy in points, or None (not finished, or null)."""
    if run is None or run.get('status') != FINISHED or \
            run.get(field) is None:
        return None
    return 100.0 * run[field]


def ended(run):
    return run is not None and run.get('status') in (FINISHED, DIVERGED)


# -- text with its raw numbers ------------------------------------------
NUMBER = re.compile(r'[+-]?\d+(?:\.\d+)?')


class Text(object):
    """A cell's recomputed text, each number formatted from a raw value
    kept for the comparison (:func:`same`)."""

    def __init__(self, *parts):
        self.parts = []         # (text, raw value or None: exact)
        for p in parts:
            self.lit(p)

    def lit(self, s):
        self.parts.append((s, None))
        return self

    def num(self, value, spec):
        self.parts.append((format(value, spec), float(value)))
        return self

    def extend(self, other):
        self.parts += other.parts
        return self

    def __str__(self):
        return ''.join(s for s, _ in self.parts)

    def tokens(self):
        """(skeleton, [(number text, raw or None)])."""
        skel, toks = [], []
        for s, raw in self.parts:
            if raw is not None:
                skel.append('#')
                toks.append((s, raw))
                continue
            pos = 0
            for m in NUMBER.finditer(s):
                skel.append(s[pos:m.start()] + '#')
                toks.append((m.group(), None))
                pos = m.end()
            skel.append(s[pos:])
        return ''.join(skel), toks


def _decimals(s):
    return len(s.split('.')[1]) if '.' in s else 0


def same(printed, expected):
    """Whether a printed cell is the recomputed :class:`Text`: equal but for
    numbers, each the raw value rounded to the decimals printed."""
    printed = printed.strip()
    want = str(expected)
    if printed == want or (printed in DASHES and want in DASHES):
        return True
    skel, toks = expected.tokens()
    got, pos = [], 0
    pskel = []
    for m in NUMBER.finditer(printed):
        pskel.append(printed[pos:m.start()] + '#')
        got.append(m.group())
        pos = m.end()
    pskel.append(printed[pos:])
    if ''.join(pskel) != skel or len(got) != len(toks):
        return False
    for g, (t, raw) in zip(got, toks):
        if raw is None:
            if g != t:
                return False
            continue
        d = _decimals(t)
        if _decimals(g) != d or abs(float(g) - raw) > \
                0.5 * 10 ** -d + TIE:
            return False
    return True


# -- the cells' arithmetic -----------------------------------------------
def summary(rs):
    """(accuracies in points, diverged, mean skipped steps) of runs."""
    accs = [a for a in (points(r) for r in rs) if a is not None]
    div = sum(1 for r in rs if r.get('status') == DIVERGED)
    skipped = [r.get('skipped_steps') or 0 for r in rs if ended(r)]
    return accs, div, (sum(skipped) / len(skipped) if skipped else 0.0)


def runs_cell(rs, note=''):
    """The :class:`Text` of a cell of runs (module docstring)."""
    accs, div, skipped = summary(rs)
    if not accs:
        return Text('diverged ({})'.format(div) if div else '—')
    t = Text().num(numpy.mean(accs), '.2f')
    if len(accs) > 1:
        t.lit(' ± ').num(numpy.std(accs, ddof=1), '.2f')
    t.lit(note)
    if len(accs) > 1 or div:
        t.lit(' (n={}{})'.format(len(accs), ', {} diverged'.format(div)
                                 if div else ''))
    x = round(skipped, 1)
    if x:
        t.lit(' [{:g} skipped]'.format(x))
    return t


def differences(mine, theirs, chance=CHANCE):
    """(pairs dropped, diverged at chance): the paired differences in
    points, seed by seed, of {seed: run} against {seed: run}; the first over
    the seeds where both have an accuracy, the second over those where both
    ended, a run without an accuracy scored at ``chance`` (points)."""
    def scored(run):
        a = points(run)
        return chance if a is None else a
    dropped, at_chance = [], []
    for seed in sorted(mine):
        a, b = mine[seed], theirs.get(seed)
        if points(a) is not None and points(b) is not None:
            dropped.append(points(a) - points(b))
        if ended(a) and ended(b):
            at_chance.append(scored(a) - scored(b))
    return dropped, at_chance


def interval(diffs):
    """(n, mean, half-width or None, verdict or None, two-sided p or None)
    of paired differences."""
    d = numpy.asarray(diffs, dtype=float)
    n = len(d)
    if n == 0:
        return 0, None, None, None, None
    mean = float(d.mean())
    if n == 1:
        return 1, mean, None, 'n < 2', None
    sd = float(d.std(ddof=1))
    half = float(scipy_stats.t.ppf(1 - ALPHA / 2, n - 1)) * sd / math.sqrt(n)
    verdict = ('ahead' if mean - half > 0 else
               'behind' if mean + half < 0 else 'level')
    if sd == 0:
        p = 0.0 if mean != 0 else 1.0
    else:
        p = float(2 * scipy_stats.t.sf(abs(mean) / (sd / math.sqrt(n)),
                                       n - 1))
    return n, mean, half, verdict, p


def interval_text(iv):
    n, mean, half = iv[:3]
    if n == 0:
        return Text('–')
    t = Text().num(mean, '+.2f')
    if half is not None:
        t.lit(' ± ').num(half, '.2f')
    return t.lit(' (n={})'.format(n))


def holm(pvalues):
    """{index: rejected} of Holm's step-down at :data:`ALPHA`."""
    order = sorted(pvalues, key=lambda i: pvalues[i])
    m, out, going = len(order), {}, True
    for rank, i in enumerate(order):
        going = going and pvalues[i] <= ALPHA / (m - rank)
        out[i] = going
    return out


def wilson_text(k, n):
    if n == 0:
        return Text('–')
    z = float(scipy_stats.norm.ppf(1 - ALPHA / 2))
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n
                                           + z * z / (4 * n * n))
    lo, hi = max(0.0, centre - half), min(1.0, centre + half)
    return Text('{}/{} ('.format(k, n)).num(100 * lo, '.0f').lit('–').num(
        100 * hi, '.0f').lit(' %)')


# -- the fixed scales ------------------------------------------------------
def fixed_sweep(runs, precision, model):
    """[(mode, {seed: run})] of the fixed scales, ascending."""
    out = [(mode, by_seed(rs)) for (p, m, mode), rs in runs.items()
           if m == model and is_fixed(mode) and same_spec(p, precision)]
    return sorted(out, key=lambda x: scale_of(x[0]))


def best_fixed(runs, precision, model):
    """(mode, runs) of the best mean among the scales none of whose runs
    diverged, or (None, None)."""
    best = None
    for mode, seeds in fixed_sweep(runs, precision, model):
        accs, div, _ = summary(list(seeds.values()))
        if accs and not div:
            mean = float(numpy.mean(accs))
            if best is None or mean > best[0]:
                best = (mean, mode, list(seeds.values()))
    return (best[1], best[2]) if best else (None, None)


def split_of(rs):
    """The run.json key a fixed scale is chosen on, from all fixed runs of
    one depth and precision (``rs``): ``final_val_accuracy`` (the selection
    split of the training images) where every finished one recorded it,
    else ``final_test_accuracy``."""
    done = [r for r in rs if r.get('status') == FINISHED]
    if done and all(r.get('final_val_accuracy') is not None for r in done):
        return 'final_val_accuracy'
    return 'final_test_accuracy'


def _best(candidates, field):
    """The mode of the best mean ``field`` of ``candidates`` ([(mode,
    [runs])], ascending: a tie keeps the smaller scale)."""
    best = None
    for mode, rs in candidates:
        mean = float(numpy.mean([points(r, field) for r in rs]))
        if best is None or mean > best[0]:
            best = (mean, mode)
    return best[1]


def held_out(runs, precision, model, elsewhere=None):
    """({seed: scored run}, {seed: scale text}, the key chosen on) of the
    fixed scale chosen without the seed it is scored on, or with
    ``elsewhere`` ({(precision, model): scale text}) that scale on every
    seed (the key then None)."""
    sweep = fixed_sweep(runs, precision, model)
    if elsewhere is not None:
        scale = next((s for (p, m), s in elsewhere.items()
                      if m == model and same_spec(p, precision)), None)
        seeds = dict(sweep).get('fixed:{}'.format(scale), {})
        if scale is not None and not seeds:
            seeds = next((rs for mode, rs in sweep
                          if scale_of(mode) == float(scale)), {})
        return dict(seeds), {s: scale for s in seeds}, None
    field = split_of([r for _, seeds in sweep for r in seeds.values()])
    scored, scales = {}, {}
    for seed in sorted({s for _, seeds in sweep for s in seeds}):
        candidates = []
        for mode, seeds in sweep:
            others = [r for s, r in seeds.items() if s != seed]
            if seed in seeds and others and all(
                    points(r, field) is not None for r in others):
                candidates.append((mode, others))
        if candidates:
            mode = _best(candidates, field)
            scored[seed] = dict(sweep)[mode][seed]
            scales[seed] = mode.split(':', 1)[1]
    return scored, scales, field


def _elsewhere_sweep(path):
    """{(precision, model): [(mode, [runs])]} of another results.json's
    fixed runs."""
    with open(path) as f:
        raw = json.load(f)
    sweep = {}
    for text, rs in raw.items():
        p, m, mode = text.split('|')
        if is_fixed(mode):
            sweep.setdefault((p, m), []).append((mode, rs))
    return sweep


def split_elsewhere(path):
    """{(precision, model): run.json key} the scales of another
    results.json were chosen on (:func:`split_of` of *its* fixed runs)."""
    return {key: split_of([r for _, rs in modes for r in rs])
            for key, modes in _elsewhere_sweep(path).items()}


def chosen_elsewhere(path):
    """{(precision, model): scale text} of the best mean per depth and
    precision over the fixed runs of another results.json (a scale with a
    run without an accuracy is no candidate)."""
    sweep = _elsewhere_sweep(path)
    out = {}
    for key, modes in sweep.items():
        field = split_of([r for _, rs in modes for r in rs])
        ok = [(mode, rs) for mode, rs in sorted(
            modes, key=lambda x: scale_of(x[0]))
            if rs and all(points(r, field) is not None for r in rs)]
        if ok:
            out[key] = _best(ok, field).split(':', 1)[1]
    return out


# -- the tables' layout ----------------------------------------------------
def mode_columns(runs, precision):
    """{column name: mode} of a precision's modes with runs (fixed scales
    and fp32 aside): the label, or the mode's text where two modes share
    one."""
    modes = sorted({mode for (p, _, mode), rs in runs.items()
                    if rs and p == precision and mode != 'fp32'
                    and not is_fixed(mode)})
    labels = [label_of(mode) for mode in modes]
    return {(lab if labels.count(lab) == 1 else mode): mode
            for lab, mode in zip(labels, modes)}


def without_grad_loss(precision):
    name, opts = _split_options(precision)
    if opts.get('grad') != 'loss':
        return None
    rest = ['{}={}'.format(k, v) for k, v in opts.items() if k != 'grad']
    return name + (':' + ','.join(rest) if rest else '')


def full_recipe(precision):
    name, opts = _split_options(precision)
    if not opts or opts.get('grad') == 'loss':
        return None
    base = name + (':recipe=' + opts['recipe'] if 'recipe' in opts else '')
    return None if same_spec(base, precision) else base


def read_tables(path):
    """[(section title, header cells, [row cells])] of a Markdown file."""
    out, title = [], ''
    lines = open(path, encoding='utf-8').read().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith('**'):
            title = line
        if line.startswith('|'):
            block = []
            while i < len(lines) and lines[i].startswith('|'):
                block.append([c.strip() for c in
                              lines[i].strip().strip('|').split('|')])
                i += 1
            out.append((title, block[0], block[2:]))
            continue
        i += 1
    return out


class Checker(object):
    """The comparison of one folder's printed cells with the recomputed
    ones."""

    def __init__(self, folder, runs, out=print, verbose=False,
                 chance=CHANCE):
        self.folder, self.runs, self.out = folder, runs, out
        self.chance = chance
        self.verbose = verbose
        self.checked, self.mismatches, self.unchecked = 0, [], []
        self.elsewhere = None
        #: {(precision, model): run.json key} the scales chosen elsewhere
        #: were chosen on (None: chosen here, or the file is not found)
        self.elsewhere_split = None

    def compare(self, where, row, column, printed, expected):
        self.checked += 1
        if printed is None:
            self.mismatch(where, row, column, '(no such cell)', str(expected))
        elif not same(printed, expected):
            self.mismatch(where, row, column, printed, str(expected))

    def mismatch(self, where, row, column, printed, recomputed):
        self.mismatches.append((where, row, column, printed, recomputed))
        self.out('MISMATCH {} | row {} | column {!r}: printed {!r}, '
                 'recomputed {!r}'.format(where, row, column, printed,
                                          recomputed))

    def skip(self, where, row, column, why):
        self.unchecked.append((where, row, column, why))
        if self.verbose:
            self.out('unchecked {} | row {} | column {!r}: {}'.format(
                where, row, column, why))

    def held(self, precision, model):
        return held_out(self.runs, precision, model, self.elsewhere)[:2]

    # table1.md's first table
    def main_table(self, where, header, rows):
        if not header or header[0] != 'Depth':
            for r in rows:
                self.skip(where, r[0] if r else '?', '*', 'no Depth column')
            return
        columns = {}
        for j, name in enumerate(header[1:], 1):
            if name == 'FP32':
                columns[j] = ('float32', 'FP32')
            else:
                p, _, label = name.partition(' ')
                columns[j] = (p, label)
        expected_cols = set()
        for p in {p for p, _, _ in self.runs} - {'float32'}:
            names = set(mode_columns(self.runs, p))
            if any(is_fixed(md) for pp, _, md in self.runs if pp == p):
                names |= {'Fixed (best)', 'Fixed (held-out)'}
            expected_cols |= {'{} {}'.format(p, n) for n in names}
        printed_cols = {h for h in header[1:] if h != 'FP32'}
        for c in sorted(expected_cols - printed_cols):
            self.mismatch(where, 'header', c, '(no such column)',
                          'a column (the runs have it)')
        for c in sorted(printed_cols - expected_cols):
            self.mismatch(where, 'header', c, 'a column',
                          '(no runs of it)')
        for row in rows:
            model = row[0]
            for j, cell in enumerate(row[1:], 1):
                if j not in columns:
                    self.skip(where, model, '?', 'more cells than columns')
                    continue
                p, label = columns[j]
                name = header[j]
                if p == 'float32':
                    self.compare(where, model, name, cell, runs_cell(
                        lookup(self.runs, 'float32', model, 'fp32')))
                elif label == 'Fixed (best)':
                    mode, rs = best_fixed(self.runs, p, model)
                    self.compare(where, model, name, cell, runs_cell(
                        rs, ' (S={})'.format(mode.split(':', 1)[1]))
                        if mode else Text('—'))
                elif label.startswith('Fixed (held-out'):
                    scored, scales = self.held(p, model)
                    self.compare(where, model, name, cell, runs_cell(
                        list(scored.values()), ' (S={})'.format('/'.join(
                            scales[s] for s in sorted(scales))))
                        if scored else Text('—'))
                else:
                    mode = mode_columns(self.runs, p).get(label)
                    if mode is None and any(
                            same_spec(md, label) for pp, _, md in self.runs
                            if pp == p):
                        mode = label
                    if mode is None:
                        # no runs of this column: every cell must be empty
                        self.compare(where, model, name, cell, Text('—'))
                        continue
                    self.compare(where, model, name, cell, runs_cell(
                        lookup(self.runs, p, model, mode)))

    # the paired tables
    def theirs(self, kind, precision, model, mode):
        """{seed: run} a row's method is compared with, or None (no such
        comparison for this row)."""
        if kind == 'held-out':
            return self.held(precision, model)[0]
        if kind == 'recipe':
            base = without_grad_loss(precision)
            return None if base is None else by_seed(
                lookup(self.runs, base, model, 'none'))
        if kind == 'full recipe':
            base = full_recipe(precision)
            return None if base is None else by_seed(
                lookup(self.runs, base, model, mode))
        if kind == 'mode default':
            base = mode.split(':', 1)[0]
            return None if base == mode else by_seed(
                lookup(self.runs, precision, model, base))
        raise AssertionError(kind)

    def expected_rows(self, kind, models):
        """{(model, precision, mode)} the paired table of ``kind`` has
        rows for: every method with runs that has its comparison."""
        out = set()
        for (p, m, mode), rs in self.runs.items():
            if not rs or m not in models or p == 'float32' or \
                    mode == 'fp32' or is_fixed(mode):
                continue
            if kind == 'held-out':
                if self.elsewhere is not None:
                    has = any(mm == m and same_spec(pp, p)
                              for pp, mm in self.elsewhere)
                else:
                    has = bool(self.held(p, m)[0])
            elif kind == 'recipe':
                has = without_grad_loss(p) is not None
            elif kind == 'full recipe':
                base = full_recipe(p)
                has = mode == 'none' and base is not None and bool(
                    lookup(self.runs, base, m, mode))
            else:
                base = mode.split(':', 1)[0]
                has = base != mode and bool(lookup(self.runs, p, m, base))
            if has:
                out.add((m, p, mode))
        return out

    def paired_table(self, where, kind, header, rows, models):
        cols = {}
        for j, h in enumerate(header):
            if h == 'Method':
                cols.setdefault('name' if 'name' not in cols else 'mine', j)
            elif j == 4:
                cols['theirs'] = j
            elif 'diverged at chance' in h:
                cols['chance'] = j
            elif 'pairs dropped' in h or 'mean ± 95 %' in h:
                cols['dropped'] = j
            elif h in ('verdict', 'Holm', 'ahead', 'Depth', 'Precision'):
                cols[h] = j
            else:
                for r in rows:
                    self.skip(where, ' '.join(r[:3]), h, 'column not known')
        new = 'chance' in cols
        printed_rows, stats = {}, {}
        for i, row in enumerate(rows):
            m, p, mode = row[0], row[1], row[2]
            printed_rows[(m, p, mode)] = i
            mine = by_seed(lookup(self.runs, p, m, mode))
            theirs = self.theirs(kind, p, m, mode)
            if theirs is None or not mine:
                self.mismatch(where, ' '.join(row[:3]), 'Method', mode,
                              '(no such comparison in the runs)')
                continue
            stats[i] = differences(mine, theirs, self.chance) + (mine,
                                                                 theirs)
        pvalues = {i: interval(c)[4] for i, (_, c, _, _) in stats.items()
                   if len(c) >= 2}
        rejected = holm(pvalues)
        for i, (dropped, chance, mine, theirs) in stats.items():
            row = rows[i]
            name = ' '.join(row[:3])

            def cell(key):
                return row[cols[key]] if key in cols and \
                    cols[key] < len(row) else None
            self.compare(where, name, 'Method', cell('mine'),
                         runs_cell(list(mine.values())))
            self.compare(where, name, header[cols['theirs']], cell('theirs'),
                         runs_cell(list(theirs.values())) if theirs
                         else Text('—'))
            basis = chance if new else dropped
            iv = interval(basis)
            if not new and not dropped:
                # the earlier format's row of a method with no pair
                self.compare(where, name, header[cols['dropped']],
                             cell('dropped'), Text('—'))
                self.compare(where, name, 'verdict', cell('verdict'),
                             Text('no seed where both finished'))
                self.compare(where, name, 'ahead', cell('ahead'),
                             Text('0/0'))
                continue
            self.compare(where, name, header[cols['dropped']],
                         cell('dropped'), interval_text(interval(dropped)))
            if new:
                self.compare(where, name, header[cols['chance']],
                             cell('chance'), interval_text(iv))
            self.compare(where, name, 'verdict', cell('verdict'), Text(
                iv[3] or 'no seed where both ended'))
            if 'Holm' in cols:
                # a row of fewer than two pairs makes no test: '—'
                want = ('—' if i not in rejected else 'level'
                        if not rejected[i] else 'ahead' if iv[1] > 0
                        else 'behind')
                self.compare(where, name, 'Holm', cell('Holm'), Text(want))
            self.compare(where, name, 'ahead', cell('ahead'), Text(
                '{}/{}'.format(sum(d > 0 for d in basis), len(basis))))
        want = self.expected_rows(kind, models)
        for key in sorted(want - set(printed_rows)):
            self.mismatch(where, ' '.join(key), '*', '(no row)',
                          'a row (the runs have this comparison)')
        for key in sorted(set(printed_rows) - want):
            if rows[printed_rows[key]] and printed_rows[key] in stats:
                self.mismatch(where, ' '.join(key), '*', 'a row',
                              '(no row: not a comparison of this table)')

    def robustness_table(self, where, header, rows, models):
        j_stats = next((j for j, h in enumerate(header)
                        if h.startswith('mean ± std')), None)
        j_rate = next((j for j, h in enumerate(header)
                       if h.startswith('collapsed or diverged')), None)
        seen = set()
        for row in rows:
            m, p, mode = row[0], row[1], row[2]
            name = ' '.join(row[:3])
            seen.add((m, p, mode))
            if mode.startswith('Fixed (held-out'):
                rs = list(self.held(p, m)[0].values())
            else:
                rs = lookup(self.runs, p, m, mode)
            if not rs:
                self.mismatch(where, name, 'Mode', mode, '(no runs)')
                continue
            if j_stats is not None:
                self.compare(where, name, header[j_stats], row[j_stats],
                             runs_cell(rs))
            ref = by_seed(lookup(self.runs, 'float32', m, 'fp32'))
            ref_accs = summary(list(ref.values()))[0]
            if j_rate is None or not ref_accs:
                self.skip(where, name, 'rate', 'no FP32 runs')
                continue
            ref_mean = float(numpy.mean(ref_accs))
            done = [r for r in rs if ended(r)]
            k = 0
            for r in done:
                floor = points(ref.get(r['seed']))
                floor = ref_mean if floor is None else floor
                a = points(r)
                k += a is None or a < floor - COLLAPSE
            self.compare(where, name, header[j_rate], row[j_rate],
                         wilson_text(k, len(done)))
        want = set()
        for (p, m, mode), rs in self.runs.items():
            if rs and m in models and p != 'float32' and \
                    summary(lookup(self.runs, 'float32', m, 'fp32'))[0]:
                want.add((m, p, mode))
                if self.held(p, m)[0]:
                    # the scale the methods are compared with (issue 47)
                    want.add((m, p, 'Fixed (held-out)'))
        for key in sorted(want - seen):
            if key[2] != 'Fixed (held-out)' or any(
                    k[2].startswith('Fixed') for k in seen):
                self.mismatch(where, ' '.join(key), '*', '(no row)',
                              'a row (the runs have it)')

    def table4(self, where, header, rows):
        known = {p for p, _, _ in self.runs}
        seen = set()
        for row in rows:
            m, p = row[0], row[1]
            seen.add((m, p))
            if not any(same_spec(p, k) for k in known):
                self.mismatch(where, '{} {}'.format(m, p), 'Precision', p,
                              '(no runs of this precision)')
            for j in range(2, len(row)):
                h = header[j] if j < len(header) else '?'
                if not h.startswith('S='):
                    self.skip(where, '{} {}'.format(m, p), h, 'not S=')
                    continue
                s = float(h[2:])
                rs = next((seeds for mode, seeds in fixed_sweep(
                    self.runs, p, m) if math.isclose(
                        scale_of(mode), s, rel_tol=1e-5)), {})
                self.compare(where, '{} {}'.format(m, p), h, row[j],
                             runs_cell(list(rs.values())))
        models = {m for m, _ in seen}
        for p, m, mode in sorted(self.runs):
            if is_fixed(mode) and m in models and not any(
                    mm == m and same_spec(pp, p) for mm, pp in seen):
                self.mismatch(where, '{} {}'.format(m, p), '*', '(no row)',
                              'a row (the runs have a fixed sweep)')
                seen.add((m, p))

    def table1_file(self, path):
        text = open(path, encoding='utf-8').read()
        found = re.search(r'The fixed scales were chosen on other seeds '
                          r'\((.+?): the best mean there\): (.+)\.\n', text)
        where0 = os.path.basename(path)
        if found:
            stated = {}
            for part in found.group(2).split('; '):
                bits = part.split(' ')
                if len(bits) == 3 and bits[2].startswith('S='):
                    stated[(bits[1], bits[0])] = bits[2][2:]
            self.elsewhere = stated
            source = found.group(1)
            here = os.path.dirname(os.path.abspath(__file__))
            for cand in (source, os.path.join(here, '..', source)):
                if os.path.isfile(cand):
                    mine = chosen_elsewhere(cand)
                    for key, s in sorted(stated.items()):
                        want = next((v for (p, m), v in mine.items()
                                     if m == key[1] and same_spec(
                                         p, key[0])), None)
                        self.compare(where0 + ' [chosen elsewhere]',
                                     '{} {}'.format(key[1], key[0]), 'S',
                                     s, Text(str(want)))
                    self.elsewhere = mine
                    self.elsewhere_split = {
                        key: field for key, field in
                        split_elsewhere(cand).items() if key in mine}
                    break
            else:
                self.out('note: {} not found; the scales stated there are '
                         'taken as chosen'.format(source))
        tables = read_tables(path)
        models = [r[0] for r in tables[0][2]] if tables else []
        kinds = {'Fixed': 'held-out', 'Recipe': 'recipe',
                 'Full recipe': 'full recipe', 'Mode default': 'mode default'}
        for n, (title, header, rows) in enumerate(tables):
            where = '{} [{}]'.format(where0, title.strip('*').split('**')[0]
                                     [:60].strip() or 'table {}'.format(n))
            theirs = header[4] if len(header) > 4 else ''
            kind = next((k for key, k in kinds.items()
                         if theirs == key or (key == 'Fixed' and
                                              theirs.startswith('Fixed'))),
                        None)
            if n == 0:
                self.main_table(where, header, rows)
            elif header[:3] == ['Depth', 'Precision', 'Method'] and kind:
                self.paired_table(where, kind, header, rows, models)
            elif title.startswith('**Robustness'):
                self.robustness_table(where, header, rows, models)
            else:
                for r in rows:
                    self.skip(where, ' '.join(r[:3]), '*', 'table not known')
        self.split_note(where0, text, models)
        self.commits_note(where0, text)
        self.config_note(where0, text)
        self.data_note(where0, text)

    def split_note(self, where, text, models):
        """The line saying which images chose the held-out scale of each
        depth and precision: {'validation' or 'test': 'model precision'}."""
        line = next((x for x in text.splitlines() if x.startswith(
            'The held-out fixed scales were chosen ')), None)
        want = {}
        if self.elsewhere_split is not None:
            # chosen on another grid's runs: their split chose
            for (p, m, _), rs in self.runs.items():
                field = next((f for (pp, mm), f in
                              self.elsewhere_split.items()
                              if mm == m and same_spec(pp, p)), None)
                if rs and m in models and field is not None:
                    want.setdefault(field.split('_')[1], set()).add(
                        '{} {}'.format(m, p))
        for (p, m, mode), rs in self.runs.items():
            if self.elsewhere_split is not None:
                break
            if is_fixed(mode) and rs and m in models:
                field = split_of([r for _, seeds in fixed_sweep(
                    self.runs, p, m) for r in seeds.values()])
                want.setdefault(field.split('_')[1], set()).add(
                    '{} {}'.format(m, p))
        if line is None:
            return
        got = {}
        for part in line[len('The held-out fixed scales were chosen '):
                         ].rstrip('.').split('; '):
            split = ('val' if part.startswith('on the selection split') else
                     'test' if part.startswith('on the test images') else
                     part)
            got[split] = set(part.rpartition(' for ')[2].split(', '))
        for split in sorted(set(want) | set(got)):
            self.compare(where + ' [the split that chose]', split,
                         'depth and precision',
                         ', '.join(sorted(got.get(split, ()))),
                         Text(', '.join(sorted(want.get(split, ())))))

    def config_note(self, where, text):
        """The line naming the pooled runs whose config.yaml differs
        from the table's (module docstring)."""
        if 'Commits of the pooled runs: ' not in text:
            # a table from before the table step checked configs (issue
            # 47): it makes no claim about them
            return
        table = read_config(os.path.join(self.folder, 'config.yaml'))
        checked = [(key, r) for key, rs in self.runs.items() for r in rs
                   if r.get('_folder') and os.path.isfile(
                       os.path.join(r['_folder'], 'config.yaml'))]
        if table is None or not checked:
            return      # nothing to compare (runs from a results.json)
        differ = []
        for (p, m, mode), r in sorted(checked, key=lambda kr: (
                kr[0], kr[1]['seed'])):
            keys = differing_keys(
                expected_run_config(table, m),
                read_config(os.path.join(r['_folder'], 'config.yaml')))
            if keys:
                differ.append('{} {} {} seed {} ({})'.format(
                    m, p, mode, r['seed'], ', '.join(keys)))
        line = next((x for x in text.splitlines() if
                     ' pooled runs ran another config than this table' in x),
                    None)
        want = ("**{} pooled runs ran another config than this table's** "
                "(the keys that differ): {}.".format(len(differ), '; '.join(
                    differ[:8]) + ('; …' if len(differ) > 8 else ''))
                if differ else '(no such line)')

        def keys_as_sets(s):
            # each entry's keys in any order
            return re.sub(r'\(([^()]*)\)', lambda m: '({})'.format(
                ', '.join(sorted(m.group(1).split(', ')))), s)
        got = line if line is not None else '(no such line)'
        self.compare(where + ' [configs]', 'pooled runs of another config',
                     'line', keys_as_sets(got), Text(keys_as_sets(want)))

    def data_note(self, where, text):
        """The line naming the pooled runs of each data set where their
        run.json data records name more than one (module docstring)."""
        if 'Commits of the pooled runs: ' not in text:
            return
        data = {}
        for (p, m, mode), rs in sorted(self.runs.items()):
            for r in sorted(rs, key=lambda r: r['seed']):
                record = r.get('data')
                if isinstance(record, dict) and record.get('fingerprint'):
                    data.setdefault(record['fingerprint'][:10], []).append(
                        '{} {} {} seed {}'.format(m, p, mode, r['seed']))
        want = ('**The pooled runs read different data files** (the '
                'fingerprint of their data record: runs): {}.'.format(
                    '; '.join('{} ({}: {}{})'.format(
                        fp, len(names), ', '.join(names[:2]),
                        ', …' if len(names) > 2 else '')
                        for fp, names in sorted(data.items())))
                if len(data) > 1 else '(no such line)')
        line = next((x for x in text.splitlines() if x.startswith(
            '**The pooled runs read different data files**')),
            '(no such line)')
        self.compare(where + ' [data]', 'pooled runs of other data', 'line',
                     line, Text(want))

    def commits_note(self, where, text):
        """The line naming the commits the pooled runs ran at, counted."""
        line = next((x for x in text.splitlines() if x.startswith(
            'Commits of the pooled runs: ')), None)
        if line is None:
            return
        counts = {}
        for rs in self.runs.values():
            for r in rs:
                c = (r.get('git_commit') or 'unknown')[:10]
                counts[c] = counts.get(c, 0) + 1
        self.compare(where + ' [commits]', 'Commits of the pooled runs',
                     'commits', line, Text(
                         'Commits of the pooled runs: {}.'.format(', '.join(
                             '{} ({})'.format(c, n)
                             for c, n in sorted(counts.items())))))


def check_folder(folder, out=print, verbose=False, chance=CHANCE):
    """The :class:`Checker` of one folder, after comparing every cell."""
    t1 = os.path.join(folder, 'table1.md')
    t4 = os.path.join(folder, 'table4.md')
    if not os.path.isdir(folder):
        raise BadInput('{}: no such folder'.format(folder))
    if not (os.path.isfile(t1) or os.path.isfile(t4)):
        raise BadInput('{}: expected table1.md or table4.md in it'.format(
            folder))
    runs, notes, bad = load_runs(folder)
    c = Checker(folder, runs, out, verbose, chance)
    for b in bad:
        c.mismatch(*b)
    for n in notes:
        out('note: ' + n)
    if os.path.isfile(t1):
        c.table1_file(t1)
    if os.path.isfile(t4):
        for title, header, rows in read_tables(t4):
            c.table4('table4.md', header, rows)
    return c


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('folders', nargs='+', help='table folders (table1.md, '
                    'table4.md, results.json and/or <precision>/<run>/'
                    'run.json)')
    ap.add_argument('-v', '--verbose', action='store_true',
                    help='also list the cells left unchecked')
    ap.add_argument('--chance', type=float, default=CHANCE,
                    help='points a run without an accuracy is scored at '
                    '(100 / classes; default %(default)g)')
    a = ap.parse_args(argv)
    status = 0
    for folder in a.folders:
        print('== {}'.format(folder))
        try:
            c = check_folder(folder, verbose=a.verbose, chance=a.chance)
        except BadInput as e:
            print('error: {}'.format(e), file=sys.stderr)
            return 2
        print('{}: {} cells checked, {} mismatches, {} cells left '
              'unchecked'.format(folder, c.checked, len(c.mismatches),
                                 len(c.unchecked)))
        status = max(status, 1 if c.mismatches else 0)
    return status


if __name__ == '__main__':
    sys.exit(main())
