"""The one training recipe: every study that trains runs
:meth:`ada_loss.experiment.recipe.TrainingStudy.run`, the only place in the
harness that constructs Chainer's Trainer."""
import os
import re

import pytest

import ada_loss.experiment
from ada_loss.experiment import optimization, recipe, settings
from ada_loss.experiment.studies import (
    aps, classification, depth, detection, figures, fp8_diagnosis, imagenet)

HARNESS = os.path.dirname(os.path.abspath(ada_loss.experiment.__file__))


def test_one_place_constructs_the_trainer():
    found = []
    for folder, _, files in os.walk(HARNESS):
        for name in files:
            if name.endswith('.py'):
                path = os.path.join(folder, name)
                with open(path) as f:
                    text = f.read()
                found += [(os.path.relpath(path, HARNESS), m.start())
                          for m in re.finditer(r'\bTrainer\(', text)]
    assert [path for path, _ in found] == ['recipe.py']


@pytest.mark.parametrize('study', [
    classification.STUDY, imagenet.STUDY, detection.STUDY, aps.TABLE4,
    figures.STUDY, depth.STUDY, fp8_diagnosis.STUDY],
    ids=lambda s: type(s).__name__)
def test_every_training_study_runs_the_recipe(study):
    assert isinstance(study, recipe.TrainingStudy)
    assert type(study).run is recipe.TrainingStudy.run


def test_computing_studies_do_not_train():
    for study in (aps.TABLE9, aps.COST):
        assert not isinstance(study, recipe.TrainingStudy)


@pytest.mark.parametrize('study', [classification, imagenet, detection,
                                   figures])
def test_every_training_entry_has_a_precision_setting(study):
    from ada_loss.experiment import config as C
    keys = [line.split(':')[0] for line in C.describe(study.STUDY.Config)]
    assert 'train.precision' in keys or 'precision' in keys


@pytest.mark.parametrize('mode, t_uf, bound', [
    ('adaptive', 1e-3, 'output'),                # AdaptiveScaling's defaults
    ('adaptive:t_uf=0.01,bound=product', 0.01, 'product'),
    ('amax', 1e-3, None),                        # the probe's own
    ('fixed:128', 1e-3, None)])
def test_the_probe_takes_the_methods_options(mode, t_uf, bound):
    """The GEMM probe recomputes the bounds with the loss scaling's own T_uf
    and bound: no mode defaults are re-derived in the harness."""
    from ada_loss.analysis.gemm_probe import ProbingLossScaling
    from ada_loss.scaling import parse_mode
    log = settings.Log(probe_every=3)
    scaling = optimization.make_scaling(parse_mode(mode), 'mixed16', log)
    assert isinstance(scaling, ProbingLossScaling)
    assert (scaling.t_uf, scaling.bound, scaling.mode) == (
        t_uf, bound, str(parse_mode(mode)))


def _calls(text, name):
    """The argument texts of every call ``name(...)`` in ``text``."""
    out = []
    for m in re.finditer(r'\b' + name + r'\(', text):
        depth, i = 1, m.end()
        while depth:
            depth += {'(': 1, ')': -1}.get(text[i], 0)
            i += 1
        out.append(text[m.end():i - 1])
    return out


def test_every_model_of_the_harness_takes_the_runs_seed():
    """NVFP4's stochastic rounding is seeded by the run's seed: every model
    the harness builds passes it (Classifier, build_ssd), and a
    classification run's layers carry it."""
    calls = []
    for folder, _, files in os.walk(HARNESS):
        for name in files:
            if name.endswith('.py'):
                with open(os.path.join(folder, name)) as f:
                    text = f.read()
                calls += [(name, args) for fn in ('Classifier', 'build_ssd')
                          for args in _calls(text, fn)]
    assert len(calls) >= 6
    assert [c for c in calls if 'seed' not in c[1]] == []
    study = classification.STUDY
    run = study.setup(study.Config(), classification.Cell(
        'small_cnn', 'digits', 'none', 7, 'nvfp4'))
    model = study.model(run, None)
    seeds = [link.gemm_scaling.recipe.seed for link in model.links()
             if getattr(link, 'gemm_scaling', None) is not None]
    assert seeds and set(seeds) == {7}
