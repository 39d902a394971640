#!/usr/bin/env python
"""Figures 1 and 4 of the paper and the σ_max ratio of §4.2.

    python experiments/figures.py --config configs/figures.yaml \
        [--profile NAME] [--set key=value ...] [--out DIR]

Runs the short recorded trainings of a profile of the config (FP32 for
Fig. 1; fixed and adaptive mixed16 for Fig. 4 and σ_max) and writes
``fig1.png``, ``fig4a.png``, ``fig4b.png``, ``summary.json`` (σ_max ratio,
Δ underflow per layer, run infos) and ``records_<run>.csv`` (one row per
recorded iteration and GEMM layer; fields in ada_loss.analysis.FIELDS) to
the profile's ``out`` folder. See :mod:`ada_loss.analysis`.
"""
import argparse
import json
import sys

import yaml

from ada_loss.analysis.figure_run import DEFAULTS, make_figures


def load_config(path, profile=None, overrides=()):
    """The settings of ``profile`` (default: the file's ``profile``) over
    :data:`DEFAULTS`, then ``key=value`` overrides (values parsed as YAML)."""
    with open(path) as f:
        doc = yaml.safe_load(f) or {}
    profiles = doc.get('profiles', {})
    name = profile or doc.get('profile')
    if name not in profiles:
        raise SystemExit('profile {!r} not in {}; available: {}'.format(
            name, path, ', '.join(profiles) or '-'))
    cfg = dict(DEFAULTS)
    cfg.update(profiles[name] or {})
    for item in overrides:
        key, eq, value = item.partition('=')
        if not eq or key not in DEFAULTS:
            raise SystemExit('bad --set {!r}: expected key=value with key '
                             'one of {}'.format(item, ', '.join(DEFAULTS)))
        cfg[key] = yaml.safe_load(value)
    return cfg


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--config', required=True)
    parser.add_argument('--profile', default=None)
    parser.add_argument('--set', nargs='*', default=[], metavar='KEY=VALUE')
    parser.add_argument('--out', default=None)
    args = parser.parse_args(argv)
    cfg = load_config(args.config, args.profile, args.set)
    if args.out:
        cfg['out'] = args.out
    paths = make_figures(cfg)
    with open(paths['summary']) as f:
        summary = json.load(f)
    for key, path in sorted(paths.items()):
        print('{}: {}'.format(key, path))
    if 'sigma_max' in summary:
        print('sigma_max fixed / adaptive = {ratio:.4g} ({sigma_max_fixed:.4g}'
              ' / {sigma_max_adaptive:.4g})'.format(**summary['sigma_max']))
    return paths


if __name__ == '__main__':
    sys.exit(0 if main() else 1)
