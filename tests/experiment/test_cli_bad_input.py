"""The command line on bad ``--set`` and ``--only`` values
(docs/reliability.md): exit status 2, exactly one line on stderr, starting
``error:``, no traceback, and no run folder created; a good value reaches
the point where a run would start (the run itself is replaced here)."""
import contextlib
import io
import os
import shutil
import tempfile

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from ada_loss.experiment.runner import main
from ada_loss.experiment.studies.classification import ClassificationStudy

from property_helpers import examples

TINY = {
    'table': 'tiny',
    'grid': {'models': ['small_cnn'], 'datasets': ['digits'],
             'modes': ['fp32', 'adaptive'], 'fixed_scales': [128],
             'seeds': [0]},
    'model': {'width': 4},
    'data': {'train_size': 64, 'test_size': 32},
    'train': {'batchsize': 32, 'max_iterations': 1},
    'log': {'progress': 'none'},
}


class _Reached(Exception):
    """A run would have started."""


class _ProbeStudy(ClassificationStudy):
    """The classification study with nothing loaded and no run trained."""

    def preload(self, cfg, cells):
        return None

    def run(self, cfg, cell, out, resume=False, comm=None, cache=None):
        raise _Reached()


STUDY = _ProbeStudy()


def _call(argv):
    """(status or 'reached', stderr) of one command line."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), \
            contextlib.redirect_stdout(io.StringIO()):
        try:
            status = main(STUDY, argv)
        except _Reached:
            status = 'reached'
    return status, err.getvalue()


@pytest.fixture(scope='module')
def workdir():
    folder = tempfile.mkdtemp(prefix='ada_cli_')
    path = os.path.join(folder, 'tiny.yaml')
    with open(path, 'w') as f:
        yaml.safe_dump(TINY, f)
    yield folder, path
    shutil.rmtree(folder)


def _check(argv, workdir):
    folder, config = workdir
    out = os.path.join(folder, 'results')
    status, err = _call(['--config', config, '--out', out] + argv)
    if status == 'reached':     # good input: its run's folder may exist
        shutil.rmtree(out, ignore_errors=True)
        return True
    assert status == 2, (argv, status, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: '), err
    assert 'Traceback' not in err
    assert not os.path.exists(out), 'a folder was created for bad input'
    return False


# (a --set or --only value, the reason its error must give): the named
# defects of issue 36 and their kin
SPECIFIC = [
    (['--set', 'train.precision=mxfp8:block=0'],
     'block must be an integer ≥ 1, got 0'),
    (['--set', 'train.precision=fp8:recipe=foo'],
     "recipe=current or recipe=delayed is required, got 'foo'"),
    (['--set', 'train.precision="fp8:recipe=delayed,history=-1"'],
     'history must be an integer in 1..1048576, got -1'),
    (['--set', 'grid.precisions=[mxfp8:block=0]'],
     'block must be an integer ≥ 1, got 0'),
    (['--set', 'grid.modes=[adaptive:t_uf=abc]'],
     "t_uf must be in (0, 1), got 'abc'"),
    (['--set', 'grid.modes=["amax:history=0"]'],
     'history must be a positive integer, got 0'),
    (['--set', 'grid.modes=["dynamic:style=tf,interval=3"]'],
     'interval'),
    (['--set', 'train.lr=' + '9' * 5000], 'train.lr'),
    (['--set', 'train.lr=[1'], 'not valid YAML'),
    (['--only', 'precision=mxfp8:block=0'],
     'block must be an integer ≥ 1, got 0'),
    (['--only', 'mode=adaptive:t_uf=2'], 'matches no run'),
]


@pytest.mark.parametrize('argv, reason', SPECIFIC)
def test_each_bad_option_gives_its_reason_in_one_line(argv, reason,
                                                      workdir):
    assert not _check(argv, workdir)
    folder, config = workdir
    _, err = _call(['--config', config, '--out', folder + '/r'] + argv)
    assert reason in err, err


_values = st.sampled_from([
    'mxfp8', 'mxfp8:block=16', 'mxfp8:block=0', 'fp8:recipe=foo', 'fp8',
    '"fp8:recipe=delayed,history=-1"', 'adaptive', 'adaptive:t_uf=abc',
    '[adaptive, fp32]', '[]', '{}', 'null', '.nan', '.inf', '-1', '0', '3',
    '1e400', '9' * 400, '"ü"', '[1', ':', 'fixed:1e9', '"1 epoch"',
    '[amax:margin=-1]', 'dynamic:style=foo', '!!python/name:os.system']) | \
    st.text(max_size=8)
_keys = st.sampled_from([
    'train.precision', 'grid.precisions', 'grid.modes', 'grid.fixed_scales',
    'grid.seeds', 'train.lr', 'train.epochs', 'log.log_interval',
    'model.width', 'comm.format', 'per_model.small_cnn.train.lr', 'train',
    'grid.nope', 'data.train_size'])
_set = st.builds('{}={}'.format, _keys, _values)
_only = st.builds('{}={}'.format, st.sampled_from(
    ['mode', 'precision', 'seed', 'model', 'dataset', 'x']), st.sampled_from(
    ['adaptive', 'fp32', 'fixed:128', 'mixed16', 'mxfp8:block=0', '0', '1',
     'small_cnn', 'digits', 'ADAPTIVE', 'fixed:128.0', '']) | st.text(
         max_size=6))


@settings(max_examples=examples(300))
@given(st.lists(st.tuples(st.sampled_from(['--set', '--only']),
                          _set | _only), min_size=1, max_size=3))
def test_bad_command_lines_end_in_one_error_line(workdir, args):
    argv = [a for pair in args for a in pair]
    _check(argv, workdir)


def test_resume_into_another_model_stops_and_keeps_the_snapshot(
        tiny_config, out_dir):
    """--resume of a run whose snapshot does not fit (another width): one
    error line naming the key, exit 2, the snapshots byte for byte as they
    were (starting afresh would have overwritten them)."""
    from ada_loss.experiment.studies.classification import STUDY as REAL
    path = tiny_config()
    assert main(REAL, ['--config', path, '--out', out_dir, '--no-table']) == 0
    folder, = [os.path.join(out_dir, 'tiny', n)
               for n in os.listdir(os.path.join(out_dir, 'tiny'))
               if not n.startswith('.')]
    snaps = {n: open(os.path.join(folder, n), 'rb').read()
             for n in os.listdir(folder) if n.startswith('snapshot_')}
    assert 'snapshot_latest' in snaps
    # a folder whose config.yaml disagrees with its snapshots (edited, or
    # a copy from elsewhere) and whose run did not finish: the harness
    # compares the request with config.yaml (they agree), so it is the
    # snapshot check that must stop the resume
    import json
    cfg_path = os.path.join(folder, 'config.yaml')
    with open(cfg_path) as f:
        cfg = yaml.safe_load(f)
    cfg['model']['width'] = 8
    with open(cfg_path, 'w') as f:
        yaml.safe_dump(cfg, f)
    info_path = os.path.join(folder, 'run.json')
    with open(info_path) as f:
        info = json.load(f)
    info['status'] = 'interrupted'
    with open(info_path, 'w') as f:
        json.dump(info, f)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = main(REAL, ['--config', path, '--out', out_dir,
                             '--no-table', '--resume',
                             '--set', 'model.width=8'])
    assert status == 2
    lines = [l for l in err.getvalue().splitlines()
             if not l.startswith('[resume]')]
    assert len(lines) == 1 and lines[0].startswith('error: '), lines
    assert 'cannot resume' in lines[0] and ', expected float32 of shape' \
        in lines[0], lines[0]
    for name, data in snaps.items():
        with open(os.path.join(folder, name), 'rb') as f:
            assert f.read() == data, name


# -- missing data and bad checksums: the real study's preload -------------------
# (issue 49 item 3: every dataset error a user can land on is one line; VOC
# and ImageNet: tests/experiment/test_paper_entries.py)
def _check_real(study, argv, workdir):
    """Status 2, one ``error:`` line, no traceback, no results folder: the
    study's own preload runs (data is loaded, or fetched, for real)."""
    folder, tiny = workdir
    out = os.path.join(folder, 'results')
    err = io.StringIO()
    with contextlib.redirect_stderr(err), \
            contextlib.redirect_stdout(io.StringIO()):
        status = main(study, ['--config', tiny, '--out', out] + argv)
    err = err.getvalue()
    assert status == 2, (argv, status, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: '), err
    assert 'Traceback' not in err
    assert not os.path.exists(out), 'a folder was created for bad input'
    return lines[0]


@pytest.mark.parametrize('argv, reason', [
    (['--set', 'grid.datasets=[cifar10]', '--set',
      'data.cifar_root=/nonexistent'], 'ada_loss.datasets.fetch cifar10'),
    (['--set', 'grid.datasets=[cifar100]', '--set',
      'data.cifar_root=/nonexistent'], 'ada_loss.datasets.fetch cifar100'),
    (['--set', 'grid.datasets=[cifar10]', '--set', 'data.cifar_root=WORK'],
     'nothing usable'),
    (['--set', 'grid.datasets=[cifar10]', '--set',
      'data.cifar_root=WORK/tiny.yaml'], 'not a readable tar archive'),
    (['--set', 'grid.datasets=[fashion_mnist]', '--set',
      'data.fashion_mnist_root=/nonexistent'],
     'ada_loss.datasets.fetch fashion_mnist'),
])
def test_missing_data_is_one_line(argv, reason, workdir):
    from ada_loss.experiment.studies.classification import STUDY as REAL
    argv = [a.replace('WORK', workdir[0]) for a in argv]
    assert reason in _check_real(REAL, argv, workdir)


# data roots a user may give: missing, empty, a file that is no archive,
# a device, the file system's root, names holding line breaks, any short
# text (relative to the current folder); every dataset read from files
_roots = st.sampled_from([
    '/nonexistent', 'WORK', 'WORK/tiny.yaml', '/dev/null', '/', '~', '""',
    'null', '/proc/self', '[a]',
    # a folder name holding a line break (YAML escapes): shown escaped
    r'"/no\nne"', r'"WORK/x\u2028y"', r'"\r"']) | st.text(max_size=8)


@settings(max_examples=examples(300))
@given(dataset=st.sampled_from(['cifar10', 'cifar100', 'fashion_mnist']),
       root=_roots)
def test_bad_data_roots_end_in_one_error_line(workdir, dataset, root):
    from ada_loss.experiment.studies.classification import STUDY as REAL
    key = 'fashion_mnist_root' if dataset == 'fashion_mnist' else \
        'cifar_root'
    _check_real(REAL, ['--set', 'grid.datasets=[{}]'.format(dataset),
                       '--set', 'data.{}={}'.format(
                           key, root.replace('WORK', workdir[0]))], workdir)


def test_bad_checksum_or_no_server_on_download_is_one_line(workdir):
    """``data.download=true`` from a local server whose file is not the
    publisher's (the real checksum table), then from no server: one line
    each, and nothing is kept in the data folder."""
    from ada_loss.experiment.studies.classification import STUDY as REAL
    import local_server
    folder, _ = workdir
    root = os.path.join(folder, 'cifar')
    base = ['--set', 'grid.datasets=[cifar10]', '--set',
            'data.cifar_root=' + root, '--set', 'data.download=true']
    with local_server.LocalServer() as server:
        server.serve('cifar-10-python.tar.gz',
                     local_server.cifar10_tarball()[0])
        line = _check_real(REAL, base + ['--set', 'data.mirror=' +
                                         server.url], workdir)
        assert 'c58f30108f718f92721af3b95e74349a' in line, line
        assert server.requests == ['cifar-10-python.tar.gz']
        url = server.url
    assert os.listdir(root) == []
    line = _check_real(REAL, base + ['--set', 'data.mirror=' + url], workdir)
    assert 'cannot reach' in line
    assert os.listdir(root) == []
