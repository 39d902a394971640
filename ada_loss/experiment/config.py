"""Experiment configuration: YAML files checked against one schema.

A config is a nested dict with the sections of :data:`SCHEMA`; every leaf has
a default, a type and a one-line description (``python experiments/table1.py
--help-config`` prints them). Loading is::

    schema defaults  <-  YAML file (and the files it ``extends``)
                     <-  ``--set section.key=value`` overrides (YAML values)
                     ->  validation -> plain nested dict

Validation happens before anything runs and raises :class:`ConfigError`
naming the dotted key and what was expected: unknown keys, wrong types,
unknown models, datasets or loss-scaling modes (each mode is parsed with
:func:`ada_loss.scaling.parse_mode`, its options checked by building the
method for the run's precision, and the precision resolved with
:func:`ada_loss.scaling.resolve_precision`).

The defaults are the CIFAR recipe of He et al. (2016, §4.2) that the paper
keeps (§4.1): batch 128, momentum SGD 0.9, lr 0.1 divided by 10 at epochs 81
and 122 of 164, weight decay 1e-4; ResNet-110 warms up at lr 0.01 for about
400 iterations (``per_model.resnet110.train.warmup_iterations``).
"""
import copy
import math
import os
import re

import yaml

from ada_loss.experiment.data import DATASETS
from ada_loss.experiment.models import MODEL_HELP, check_model_name


class ConfigError(ValueError):
    """A bad configuration: ``key`` is the dotted key at fault."""

    def __init__(self, key, message):
        self.key = key
        super(ConfigError, self).__init__(
            'config key {!r}: {}'.format(key, message) if key else message)


# -- leaf types ---------------------------------------------------------------
class Field(object):
    """A leaf: ``check(value, key)`` returns the normalized value or raises
    :class:`ConfigError`; ``expected`` describes the type for messages."""

    def __init__(self, default, check, expected, doc):
        self.default = default
        self.check = check
        self.expected = expected
        self.doc = doc


def _fail(key, expected, value):
    raise ConfigError(key, 'expected {}, got {!r} ({})'.format(
        expected, value, type(value).__name__))


def integer(default, doc, minimum=None, optional=False):
    expected = 'an integer' + ('' if minimum is None else ' >= {}'.format(
        minimum)) + (' or null' if optional else '')

    def check(value, key):
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or (
                minimum is not None and value < minimum):
            _fail(key, expected, value)
        return value
    return Field(default, check, expected, doc)


def number(default, doc, minimum=None, positive=False, optional=False):
    expected = 'a number' + (' > 0' if positive else '') + (
        '' if minimum is None else ' >= {}'.format(minimum)) + (
        ' or null' if optional else '')

    def check(value, key):
        if value is None and optional:
            return None
        if isinstance(value, str):   # YAML 1.1 reads 1e-4 as a string
            try:
                value = float(value)
            except ValueError:
                _fail(key, expected, value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or (positive and value <= 0) \
                or (minimum is not None and value < minimum):
            _fail(key, expected, value)
        return float(value)
    return Field(default, check, expected, doc)


def boolean(default, doc):
    def check(value, key):
        if not isinstance(value, bool):
            _fail(key, 'true or false', value)
        return value
    return Field(default, check, 'true or false', doc)


def string(default, doc, choices=None, optional=False):
    expected = ('one of ' + ', '.join(map(str, choices))) if choices \
        else 'a string'
    expected += ' or null' if optional else ''

    def check(value, key):
        if value is None and optional:
            return None
        if not isinstance(value, str) or (choices and value not in choices):
            _fail(key, expected, value)
        return value
    return Field(default, check, expected, doc)


def list_of(item, default, doc, nonempty=True):
    """A list whose items are checked by the Field ``item``; a scalar is
    accepted as a one-item list (``--set grid.seeds=3``)."""
    expected = 'a {}list of {}'.format('non-empty ' if nonempty else '',
                                       item.expected)

    def check(value, key):
        if not isinstance(value, (list, tuple)):
            value = [value]
        if nonempty and not value:
            _fail(key, expected, value)
        out = []
        for i, v in enumerate(value):
            v = item.check(v, '{}[{}]'.format(key, i))
            if v not in out:
                out.append(v)
        return out
    return Field(list(default), check, expected, doc)


_UNITS = {'epoch': 'epoch', 'epochs': 'epoch', 'iteration': 'iteration',
          'iterations': 'iteration', 'iter': 'iteration'}


def interval(default, doc):
    """``"N epoch"``, ``"N iteration"`` or ``[N, unit]`` -> ``[N, unit]``."""
    expected = '"N epoch" or "N iteration" (N a positive integer)'

    def check(value, key):
        parts = value.split() if isinstance(value, str) else value
        if not isinstance(parts, (list, tuple)) or len(parts) != 2:
            _fail(key, expected, value)
        n, unit = parts
        if isinstance(n, bool) or (isinstance(n, float) and
                                   not n.is_integer()):
            _fail(key, expected, value)
        try:
            n = int(n)
        except (TypeError, ValueError):
            _fail(key, expected, value)
        if n < 1 or not isinstance(unit, str) or unit not in _UNITS:
            _fail(key, expected, value)
        return [n, _UNITS[unit]]
    return Field(default, check, expected, doc)


def _model_field(default, doc):
    def check(value, key):
        if not isinstance(value, str):
            _fail(key, 'a model name ({})'.format(MODEL_HELP), value)
        try:
            return check_model_name(value)
        except ValueError as e:
            raise ConfigError(key, str(e))
    return Field(default, check, 'a model name', doc)


def _dataset_field(default, doc):
    return string(default, doc, choices=sorted(DATASETS))


def _mode_field(default, doc):
    def check(value, key):
        from ada_loss.scaling import parse_mode
        try:
            return str(parse_mode(value))
        except ValueError as e:
            raise ConfigError(key, str(e))
    return Field(default, check, 'a loss-scaling mode', doc)


def _precision_field(default, doc):
    from ada_loss.training.precision import PRECISION_HELP, parse_precision

    def check(value, key):
        if value is None:
            return None
        try:
            return parse_precision(value).name
        except ValueError as e:
            raise ConfigError(key, str(e))
    return Field(default, check, PRECISION_HELP + ' or null', doc)


def _scale_field(default, doc):
    def check(value, key):
        from ada_loss.scaling import parse_mode
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _fail(key, 'a positive number (a fixed loss scale S)', value)
        try:
            return parse_mode('fixed:{!r}'.format(value)).options['scale']
        except ValueError as e:
            raise ConfigError(key, str(e))
    return Field(default, check, 'a positive number', doc)


# -- the schema ---------------------------------------------------------------
#: Sections that ``per_model.<model>`` may override for one model.
PER_MODEL_SECTIONS = ('model', 'data', 'train', 'log')

SCHEMA = {
    'table': string('table1', 'results subfolder: results/<table>/<run>/'),
    'layout': string('table1', 'how build_tables shows the results',
                     choices=('table1', 'table4', 'precision')),
    'description': string('', 'free text, copied to every run'),
    'distributed': boolean(False, 'ChainerMN data parallelism (mpiexec); '
                                  'same as --mpi'),
    'blas_threads': integer(1, 'BLAS/OpenMP threads of each run (results '
                               'depend on it; fixed so that they do not '
                               'depend on --jobs; recorded in run.json)',
                            minimum=1),
    'grid': {
        'models': list_of(_model_field(None, ''), ['resnet20'],
                          'models ({})'.format(MODEL_HELP)),
        'datasets': list_of(_dataset_field(None, ''), ['cifar10'],
                            'datasets: ' + ', '.join(sorted(DATASETS))),
        'modes': list_of(_mode_field(None, ''),
                         ['fp32', 'none', 'dynamic', 'adaptive'],
                         'loss-scaling modes (fp32, none, fixed:S, '
                         'dynamic[:style=pytorch|chainer|tf,k=v], '
                         'adaptive[:k=v], amax[:k=v])',
                         nonempty=False),
        'fixed_scales': list_of(_scale_field(None, ''), [],
                                'fixed loss scales S, run as modes fixed:S',
                                nonempty=False),
        'seeds': list_of(integer(None, '', minimum=0), [0],
                         'random seeds (one run each)'),
        'precisions': list_of(_precision_field(None, ''), [],
                              'precisions to sweep, each into '
                              'results/<table>/<precision>/ (the precision '
                              'table; experiments/precision_table.py); '
                              'empty: train.precision only',
                              nonempty=False),
    },
    'model': {
        'width': integer(None, 'filters of the first stage (null: the '
                               "model's default, 16 for CIFAR ResNets)",
                         minimum=1, optional=True),
        'in_channels': integer(None, 'input channels (null: from the '
                                     'dataset)', minimum=1, optional=True),
        'shortcut': string(None, 'CIFAR ResNet shortcut option (null: A)',
                           choices=('A', 'B'), optional=True),
    },
    'data': {
        'cifar_root': string(None, 'CIFAR files (null: $ADA_LOSS_CIFAR_ROOT)',
                             optional=True),
        'fashion_mnist_root': string('/usr/share/datasets/fashion-mnist',
                                     'folder of the Fashion-MNIST IDX files'),
        'digits_size': integer(16, 'side of the upsampled sklearn digits',
                               minimum=8),
        'augment': boolean(True, 'CIFAR: pad 4, random crop, random flip '
                                 '(He et al. 2016, §4.2)'),
        'train_size': integer(None, 'use a random subset of this many '
                                    'training examples', minimum=1,
                              optional=True),
        'test_size': integer(None, 'use a random subset of this many test '
                                   'examples', minimum=1, optional=True),
        'split_seed': integer(0, 'seed of the digits split and of subsets',
                              minimum=0),
    },
    'train': {
        'precision': _precision_field(
            None, 'which format stores what: float32, mixed16, bf16, fp8 '
                  '(E4M3 forward, E5M2 gradients), fp8_e4m3, fp8_e5m2, or '
                  'fwd=<format>,bwd=<format> (null: float32 for fp32, '
                  'mixed16 for every other mode)'),
        'batchsize': integer(128, 'minibatch size (global, all ranks)',
                             minimum=1),
        'lr': number(0.1, 'initial learning rate', positive=True),
        'momentum': number(0.9, 'MomentumSGD momentum', minimum=0.0),
        'weight_decay': number(1e-4, 'L2 weight decay (a per-parameter hook: '
                                     'sees unscaled FP32 gradients)',
                               minimum=0.0),
        'epochs': number(164, 'training length in epochs', positive=True),
        'lr_steps': list_of(number(None, '', positive=True), [81, 122],
                            'epochs at which lr is multiplied by lr_decay',
                            nonempty=False),
        'lr_decay': number(0.1, 'lr multiplier at each step', positive=True),
        'warmup_iterations': integer(0, 'iterations at warmup_lr first '
                                        '(ResNet-110: ~400)', minimum=0),
        'warmup_lr': number(0.01, 'learning rate during warm-up',
                            positive=True),
        'max_iterations': integer(None, 'stop after this many iterations '
                                        '(overrides epochs; mini runs, '
                                        'tests)', minimum=1, optional=True),
        'eval_batchsize': integer(256, 'minibatch size of the evaluation',
                                  minimum=1),
    },
    'log': {
        'log_interval': interval('1 epoch', 'LogReport / PrintReport / '
                                            'PlotReport interval'),
        'eval_interval': interval('1 epoch', 'test-set evaluation interval'),
        'snapshot_interval': interval('1 epoch', 'trainer snapshot '
                                                 'interval (also at the end)'),
        'loss_scale_interval': integer(100, 'adaptive: record per-layer '
                                            'loss scales every K iterations',
                                       minimum=1),
        'progress': string('report', 'console output of a run',
                           choices=('report', 'bar', 'both', 'none')),
        'plot': boolean(True, 'PlotReport PNGs (loss, accuracy) and the '
                              'loss-scale plot'),
    },
    'per_model': Field({}, None, 'a mapping model -> partial config',
                       'per-model overrides of the sections ' +
                       ', '.join(PER_MODEL_SECTIONS)),
}


# -- validation ---------------------------------------------------------------
def _validate_section(schema, raw, prefix):
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(prefix.rstrip('.') or '<root>',
                          'expected a mapping, got {!r}'.format(raw))
    out = {}
    for key in raw:
        if key not in schema:
            hint = ' (train.dtype was renamed train.precision)' \
                if prefix + str(key) == 'train.dtype' else ''
            raise ConfigError(prefix + str(key), 'unknown key{}; allowed '
                              'keys here: {}'.format(
                                  hint, ', '.join(sorted(schema))))
    for key, spec in schema.items():
        full = prefix + key
        if isinstance(spec, dict):
            out[key] = _validate_section(spec, raw.get(key), full + '.')
        elif key == 'per_model':
            out[key] = _validate_per_model(raw.get(key) or {}, full)
        else:
            value = raw[key] if key in raw else copy.deepcopy(spec.default)
            out[key] = spec.check(value, full)
    return out


def validate_schema(schema, raw, prefix=''):
    """Checks ``raw`` against a nested ``schema`` of Fields (no
    ``per_model``), fills defaults; the configs of Tables 2, 3 and 5."""
    raw = raw or {}
    if not isinstance(raw, dict):
        raise ConfigError(prefix.rstrip('.') or '<root>',
                          'expected a mapping')
    for key in raw:
        if key not in schema:
            raise ConfigError(prefix + str(key), 'unknown key; allowed: '
                              + ', '.join(sorted(schema)))
    return {key: validate_schema(spec, raw.get(key), prefix + key + '.')
            if isinstance(spec, dict) else spec.check(
                raw[key] if key in raw else copy.deepcopy(spec.default),
                prefix + key)
            for key, spec in schema.items()}


def _validate_per_model(raw, key):
    if not isinstance(raw, dict):
        raise ConfigError(key, 'expected a mapping model -> {section: ...}')
    out = {}
    for model, partial in raw.items():
        mkey = '{}.{}'.format(key, model)
        try:
            name = check_model_name(str(model))
        except ValueError as e:
            raise ConfigError(mkey, str(e))
        if not isinstance(partial, dict):
            raise ConfigError(mkey, 'expected a mapping of sections ({})'
                              .format(', '.join(PER_MODEL_SECTIONS)))
        checked = {}
        for section, values in partial.items():
            if section not in PER_MODEL_SECTIONS:
                raise ConfigError('{}.{}'.format(mkey, section),
                                  'unknown section; allowed: {}'.format(
                                      ', '.join(PER_MODEL_SECTIONS)))
            values = values or {}
            if not isinstance(values, dict):
                raise ConfigError('{}.{}'.format(mkey, section),
                                  'expected a mapping')
            schema = SCHEMA[section]
            checked[section] = {}
            for k, v in values.items():
                full = '{}.{}.{}'.format(mkey, section, k)
                if k not in schema:
                    raise ConfigError(full, 'unknown key; allowed keys '
                                      'here: {}'.format(', '.join(
                                          sorted(schema))))
                checked[section][k] = schema[k].check(v, full)
        out[name] = checked
    return out


def _check_modes(cfg):
    """Every mode of the grid builds, in every precision it will run in."""
    from ada_loss.scaling import make_loss_scaling, resolve_precision
    precisions = {cfg['train']['precision']} | set(cfg['grid']['precisions'])
    for partial in cfg['per_model'].values():
        if 'precision' in partial.get('train', {}):
            precisions.add(partial['train']['precision'])
    for i, mode in enumerate(grid_modes(cfg)):
        key = 'grid.modes' if i < len(cfg['grid']['modes']) \
            else 'grid.fixed_scales'
        try:
            for precision in precisions:
                make_loss_scaling(mode, resolve_precision(mode, precision))
        except ValueError as e:
            raise ConfigError(key, 'mode {}: {}'.format(mode, e))
    if not grid_modes(cfg):
        raise ConfigError('grid.modes', 'no mode to run: give grid.modes '
                          'and/or grid.fixed_scales')


def validate(raw):
    """Checks a raw config dict and fills in the defaults.

    Returns:
        dict: the resolved config (a new nested dict).
    Raises:
        ConfigError: naming the first bad key.
    """
    cfg = _validate_section(SCHEMA, raw, '')
    _check_modes(cfg)
    return cfg


def grid_modes(cfg):
    """The grid's modes: ``grid.modes`` then ``fixed:S`` per fixed scale."""
    from ada_loss.scaling import parse_mode
    modes = list(cfg['grid']['modes'])
    for scale in cfg['grid']['fixed_scales']:
        mode = str(parse_mode('fixed:{!r}'.format(scale)))
        if mode not in modes:
            modes.append(mode)
    return modes


def config_for_model(cfg, model):
    """``cfg`` with ``per_model[model]`` merged into its sections."""
    out = copy.deepcopy(cfg)
    for section, values in cfg['per_model'].get(model, {}).items():
        out[section].update(copy.deepcopy(values))
    return out


# -- files and overrides ------------------------------------------------------
def _deep_merge(base, top):
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def read_yaml(path, _seen=()):
    """A YAML config file as a raw dict; ``extends: other.yaml`` (relative to
    the file) loads that file first and merges this one over it."""
    path = os.path.abspath(path)
    if path in _seen:
        raise ConfigError('extends', 'circular extends: {}'.format(path))
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError('', 'cannot read config file {}: {}'.format(
            path, e.strerror))
    except yaml.YAMLError as e:
        raise ConfigError('', 'config file {} is not valid YAML: {}'.format(
            path, e))
    raw = raw or {}
    if not isinstance(raw, dict):
        raise ConfigError('', 'config file {} must hold a mapping'.format(
            path))
    parent = raw.pop('extends', None)
    if parent is not None:
        if not isinstance(parent, str):
            raise ConfigError('extends', 'expected a file name')
        base = read_yaml(os.path.join(os.path.dirname(path), parent),
                         _seen + (path,))
        raw = _deep_merge(base, raw)
    return raw


_OVERRIDE = re.compile(r'^\s*([A-Za-z_][\w\-]*(?:\.[\w\-:]+)*)\s*=(.*)$',
                       re.S)


def parse_override(text):
    """``'train.lr=0.05'`` -> ``(['train', 'lr'], 0.05)`` (value as YAML)."""
    m = _OVERRIDE.match(text)
    if not m:
        raise ConfigError('', 'bad override {!r}: expected '
                          'section.key=value, e.g. train.lr=0.05'.format(text))
    try:
        value = yaml.safe_load(m.group(2)) if m.group(2).strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(m.group(1), 'override value {!r} is not valid '
                          'YAML: {}'.format(m.group(2), e))
    return m.group(1).split('.'), value


def apply_overrides(raw, overrides):
    """Sets each ``key.path=value`` of ``overrides`` in a copy of ``raw``."""
    raw = copy.deepcopy(raw)
    for text in overrides or ():
        path, value = parse_override(text)
        node = raw
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError('.'.join(path[:i + 1]),
                                  'is not a section; cannot set {}'.format(
                                      '.'.join(path)))
            node = child
        node[path[-1]] = value
    return raw


def load_config(path=None, overrides=(), raw=None):
    """Reads, overrides and validates a config (see the module docstring).

    Args:
        path (str): YAML file, or ``None`` for the defaults (or ``raw``).
        overrides (list of str): ``key.path=value`` items.
        raw (dict): a raw config used instead of a file.
    """
    base = read_yaml(path) if path else copy.deepcopy(raw or {})
    return validate(apply_overrides(base, overrides))


def dump_config(cfg):
    return yaml.safe_dump(cfg, sort_keys=False, default_flow_style=None)


def describe_schema():
    """The schema as text: ``section.key: expected (default) -- doc``."""
    lines = []

    def walk(schema, prefix):
        for key, spec in schema.items():
            if isinstance(spec, dict):
                walk(spec, prefix + key + '.')
            else:
                lines.append('{}{}: {} (default {!r}) -- {}'.format(
                    prefix, key, spec.expected, spec.default, spec.doc))
    walk(SCHEMA, '')
    from ada_loss.loss_scale.dynamic import describe_styles
    from ada_loss.training.precision import PRECISION_HELP
    lines += ['', 'dynamic loss scaling styles (grid.modes dynamic:style=..):',
              describe_styles(), '',
              'precisions (train.precision, grid.precisions): ' +
              PRECISION_HELP]
    return '\n'.join(lines)
