"""The config of ``experiments/figures.py``, on the experiment config system
(:mod:`ada_loss.experiment.config`): a schema with types and docs,
``--set key=value`` overrides, ``--help-config`` and a
:class:`~ada_loss.experiment.config.ConfigError` before anything runs.

A file holds the settings at its top level and/or named partial settings
under ``profiles``; ``profile`` (or ``--profile``) picks one, merged over
the top level. ``--set`` applies last, so it wins over the profile::

    profile: digits
    profiles:
      digits: {model: plain_cnn, iterations: 30, ...}
"""
import copy

from ada_loss.analysis.figure_run import DEFAULTS
from ada_loss.experiment import config as C


def _mapping(default, doc, value_field=None):
    def check(value, key):
        if not isinstance(value, dict):
            C._fail(key, 'a mapping', value)
        if value_field is None:
            return dict(value)
        return {k: value_field.check(v, '{}.{}'.format(key, k))
                for k, v in value.items()}
    return C.Field(default, check, 'a mapping', doc)


#: the settings of one profile (defaults: figure_run.DEFAULTS)
SETTINGS = {
    'task': C.string(DEFAULTS['task'], 'what is trained',
                     choices=('classification', 'detection')),
    'dataset': C.string(DEFAULTS['dataset'], 'training data',
                        choices=('digits', 'imagenet', 'voc')),
    'data_root': C.string(DEFAULTS['data_root'], 'dataset folder (null: '
                          '$ADA_LOSS_IMAGENET_ROOT / $ADA_LOSS_VOC_ROOT)',
                          optional=True),
    'model': C.string(DEFAULTS['model'], 'an ada_loss.models name, or '
                      'ssd512 | ssd300 | ssd_tiny'),
    'model_kwargs': _mapping(DEFAULTS['model_kwargs'], 'keyword arguments '
                             'of the model'),
    'num_classes': C.integer(DEFAULTS['num_classes'], 'classes '
                             '(classification)', minimum=1),
    'image_size': C.integer(DEFAULTS['image_size'], 'input side (digits, '
                            'imagenet crops)', minimum=4),
    'batch_size': C.integer(DEFAULTS['batch_size'], 'minibatch size',
                            minimum=1),
    'iterations': C.integer(DEFAULTS['iterations'], 'training iterations of '
                            'each run', minimum=1),
    'record_every': C.integer(DEFAULTS['record_every'], 'statistics at '
                              'iteration 1 and every K-th', minimum=1),
    'lr': C.number(DEFAULTS['lr'], 'learning rate', positive=True),
    'momentum': C.number(DEFAULTS['momentum'], 'MomentumSGD momentum',
                         minimum=0.0),
    'weight_decay': C.number(DEFAULTS['weight_decay'], 'weight decay',
                             minimum=0.0),
    'seed': C.integer(DEFAULTS['seed'], 'random seed', minimum=0),
    'photometric': C.boolean(DEFAULTS['photometric'], 'detection: '
                             'photometric distortion'),
    'modes': _mapping(DEFAULTS['modes'], "run name -> loss-scaling mode; "
                      "'fig1' (FP32) gives Fig. 1, 'fixed' + 'adaptive' "
                      "Fig. 4a/4b and the sigma_max ratio",
                      C._mode_field(None, '')),
    'out': C.string(DEFAULTS['out'], 'output folder'),
}

SCHEMA = dict(SETTINGS, **{
    'profile': C.string(None, 'the profile of `profiles` to run (null: the '
                        'top-level settings)', optional=True),
    'profiles': _mapping({}, 'name -> partial settings (keys as the '
                         'top level)'),
})


def load_config(path=None, overrides=(), profile=None):
    """The validated settings of ``profile`` (default: the file's
    ``profile``) with ``overrides`` (``key=value``, value parsed as YAML)
    applied last. Raises ConfigError."""
    raw = C.read_yaml(path) if path else {}
    raw = C.apply_overrides(copy.deepcopy(raw), overrides)
    full = C.validate_schema(SCHEMA, raw)      # types of the top level
    name = profile or full['profile']
    settings = {k: v for k, v in raw.items()
                if k not in ('profile', 'profiles')}
    if name is not None:
        if name not in full['profiles']:
            raise C.ConfigError('profile', '{!r} is not in profiles; '
                                'available: {}'.format(name, ', '.join(
                                    full['profiles']) or '-'))
        partial = full['profiles'][name] or {}
        if not isinstance(partial, dict):
            raise C.ConfigError('profiles.' + name, 'expected a mapping')
        settings.update(partial)
        settings = C.apply_overrides(settings, [
            o for o in overrides
            if C.parse_override(o)[0][0] not in ('profile', 'profiles')])
    return C.validate_schema(SETTINGS, settings,
                             '' if name is None else
                             'profiles.{}.'.format(name))


def describe():
    """``--help-config``: the schema as text."""
    lines = []
    for key, spec in SCHEMA.items():
        lines.append('{}: {} (default {!r}) -- {}'.format(
            key, spec.expected, spec.default, spec.doc))
    return '\n'.join(lines)
