#!/usr/bin/env python
"""Figures 1 and 4 of the paper and the σ_max ratio of §4.2.

    python experiments/figures.py [--config configs/figures.yaml] \
        [--profile NAME] [--set key=value ...] [--out DIR] [--help-config]

Runs the short recorded trainings of a profile of the config (FP32 for
Fig. 1; fixed and adaptive mixed16 for Fig. 4 and σ_max) and writes
``fig1.png``, ``fig4a.png``, ``fig4b.png``, ``summary.json`` (σ_max ratio,
Δ underflow per layer, run infos) and ``records_<run>.csv`` (one row per
recorded iteration and GEMM layer; fields in ada_loss.analysis.FIELDS) to
the profile's ``out`` folder. See :mod:`ada_loss.analysis`; the config
schema: :mod:`ada_loss.analysis.figure_config` (``--help-config``).
"""
import argparse
import json
import os
import sys

from ada_loss.analysis.figure_config import describe, load_config
from ada_loss.experiment.config import ConfigError

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'configs', 'figures.yaml')


def build_parser():
    p = argparse.ArgumentParser(
        description=__doc__.split('\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--config', default=DEFAULT_CONFIG,
                   help='YAML config (default: %(default)s)')
    p.add_argument('--profile', default=None,
                   help="profile of the config's `profiles` (default: its "
                        "`profile`)")
    p.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                   help='override a setting, value parsed as YAML (e.g. '
                        'iterations=10); repeatable; wins over the profile')
    p.add_argument('--out', default=None, help='output folder (= --set out=)')
    p.add_argument('--help-config', action='store_true',
                   help='print the config schema and exit')
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.help_config:
        print(describe())
        return 0
    overrides = args.set + (['out=' + args.out] if args.out else [])
    try:
        cfg = load_config(args.config, overrides, args.profile)
    except ConfigError as e:
        print('error: {}'.format(e), file=sys.stderr)
        return 2
    from ada_loss.analysis.figure_run import make_figures
    paths = make_figures(cfg)
    with open(paths['summary']) as f:
        summary = json.load(f)
    for key, path in sorted(paths.items()):
        print('{}: {}'.format(key, path))
    if 'sigma_max' in summary:
        print('sigma_max fixed / adaptive = {ratio:.4g} ({sigma_max_fixed:.4g}'
              ' / {sigma_max_adaptive:.4g})'.format(**summary['sigma_max']))
    return 0


if __name__ == '__main__':
    sys.exit(main())
