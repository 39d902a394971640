"""Each patch of ``ada_loss/_chainer_compat.py`` is needed: a child
interpreter (this environment's Python) that leaves one patch out fails the
way Chainer 7.8.1 / ChainerMN fails on today's stack, and with the patch the
same code works.

Every child drops the start-up hook that ``scripts/install.sh`` writes and
loads its own copy of ``_chainer_compat.py`` as ``ada_loss._chainer_compat``
(the module ``import ada_loss`` then uses), so a test can take one patch out.
Pieces this stack still has are removed as a newer stack removes them:
``sys.modules['numpy.distutils'] = None`` (Python >= 3.12) and
``sys.modules['pkg_resources'] = None`` (setuptools >= 82).
"""
import json
import os
import subprocess
import sys
import sysconfig
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPAT = os.path.join(ROOT, 'ada_loss', '_chainer_compat.py')

_PRELUDE = '''\
import importlib.util, json, sys, warnings
sys.meta_path[:] = [f for f in sys.meta_path
                    if type(f).__name__ != '_BeforeChainer']  # no hook
_spec = importlib.util.spec_from_file_location('ada_loss._chainer_compat',
                                               {compat!r})
compat = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compat)
sys.modules['ada_loss._chainer_compat'] = compat
'''.format(compat=COMPAT)


def _child(code, flags=(), prelude=True, timeout=180):
    """Runs ``code`` in a child interpreter; returns (returncode, stdout,
    stderr)."""
    src = (_PRELUDE if prelude else '') + textwrap.dedent(code)
    env = dict(os.environ)
    env.pop('PYTHONWARNINGS', None)
    res = subprocess.run([sys.executable] + list(flags) + ['-c', src],
                         cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout)
    return res.returncode, res.stdout, res.stderr


def _ok(code, flags=()):
    rc, out, err = _child(code, flags)
    assert rc == 0, err[-4000:]
    return out, err


def _fails(code, flags=()):
    rc, out, err = _child(code, flags)
    assert rc != 0, 'ran without the patch:\n' + out + err
    return err


# -------------------------------------------------- numpy.sctypes (NumPy 2)

def test_numpy_sctypes_for_chainer_as_strided():
    """``chainer/functions/array/as_strided.py`` reads ``numpy.sctypes``
    at import (removed in NumPy 2.0)."""
    err = _fails('''
        compat._numpy_sctypes = lambda: None      # the patch left out
        compat.apply()
        import chainer
    ''')
    assert 'AttributeError' in err and 'sctypes' in err, err[-2000:]
    _ok('''
        import numpy as np
        assert 'sctypes' not in np.__dict__       # NumPy 2 lacks it
        import ada_loss
        assert ada_loss.chainer is not None and compat.applied['numpy.sctypes']
        import chainer, chainer.functions as F
        from chainer.functions.array import as_strided
        assert as_strided.index_dtype == {1: np.int8, 2: np.int16,
                                          4: np.int32, 8: np.int64}
        x = chainer.Variable(np.arange(6, dtype=np.float32))
        y = F.as_strided(x, (2, 2), (1, 1))       # backward reads 'float'
        F.sum(y).backward()
        assert x.grad.tolist() == [1, 2, 1, 0, 0, 0], x.grad
    ''')


# ------------------------------------ numpy.distutils (gone on Python 3.12)

def test_numpy_distutils_stand_in_for_environment_check():
    """``chainer/_environment_check.py`` imports
    ``numpy.distutils.system_info`` (absent on Python >= 3.12) and calls
    ``get_info('blas_opt')`` on macOS."""
    err = _fails('''
        sys.modules['numpy.distutils'] = None     # as on Python >= 3.12
        compat._numpy_distutils = lambda: None    # the patch left out
        compat.apply()
        import chainer
    ''')
    assert 'numpy.distutils' in err, err[-2000:]
    _ok('''
        sys.modules['numpy.distutils'] = None     # as on Python >= 3.12
        import ada_loss
        assert ada_loss.chainer is not None and hasattr(ada_loss,
                                                        'AdaLossScaled')
        assert compat.applied['numpy.distutils.system_info']
        import chainer._environment_check as check
        platform, sys.platform = sys.platform, 'darwin'
        try:                                      # the macOS-only call
            with warnings.catch_warnings():
                warnings.simplefilter('error')
                check._check_osx_numpy_backend()
        finally:
            sys.platform = platform
    ''')


# ------------------------------------- pkg_resources (gone in setuptools 82)

def test_environment_check_without_pkg_resources():
    """``chainer/_environment_check.py`` imports ``pkg_resources`` (removed
    in setuptools 82) for its optional-package version check."""
    err = _fails('''
        sys.modules['pkg_resources'] = None       # as with setuptools >= 82
        compat._environment_check = lambda: None  # the patch left out
        compat.apply()
        import chainer
    ''')
    assert 'pkg_resources' in err, err[-2000:]
    # through ada_loss: Chainer's error itself, not an ada_loss without
    # its Chainer half
    err = _fails('''
        sys.modules['pkg_resources'] = None
        compat._environment_check = lambda: None
        import ada_loss
    ''')
    assert 'ModuleNotFoundError' in err and 'pkg_resources' in err, \
        err[-2000:]
    _ok('''
        sys.modules['pkg_resources'] = None       # as with setuptools >= 82
        import ada_loss
        assert ada_loss.chainer is not None and hasattr(ada_loss,
                                                        'AdaLossScaled')
        assert compat.applied['chainer._environment_check']
        import chainer.functions as F, numpy as np
        assert F.relu(np.float32([-1, 2])).array.tolist() == [0, 2]
    ''')


def _pkg_resources_warns():
    rc, out, err = _child('''
        import json, warnings
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter('always')
            try:
                import pkg_resources  # NOQA
            except ImportError:
                pass
        print(json.dumps(any('pkg_resources is deprecated' in str(x.message)
                             for x in w)))
    ''', prelude=False)
    assert rc == 0, err
    return json.loads(out)


def test_pkg_resources_deprecation_is_not_the_users():
    """setuptools 81's ``pkg_resources`` warns at import (a UserWarning);
    Chainer imports it for its own check. A program that imports ``chainer``
    first (start-up hook) sees no warning."""
    if not _pkg_resources_warns():
        pytest.skip('this setuptools has no warning at import of '
                    'pkg_resources (the patch does nothing here)')
    hooked = '''
        compat.install_import_hook()              # as the start-up hook does
        import chainer
        print('ok')
    '''
    err = _fails('compat._quiet_pkg_resources = lambda: None\n' +
                 textwrap.dedent(hooked),
                 flags=['-W', 'error::UserWarning'])
    assert 'pkg_resources is deprecated' in err, err[-2000:]
    out, err = _ok(hooked, flags=['-W', 'error::UserWarning'])
    assert err == '' and out.strip() == 'ok'


# ---------------------------------------- ChainerMN unpack_params (NumPy 2)

_UNPACK = '''
    import numpy as np
    if importlib.util.find_spec('mpi4py') is None:
        print(json.dumps('mpi4py not installed (./scripts/install.sh mpi)'))
        sys.exit(0)
    import chainermn.communicators._memory_utility as mu
    import chainer

    class HostBuffer:
        """DeviceMemory's interface on host memory: the received packed
        float32 gradients."""
        def __init__(self, values):
            self.values = values

        def to_device(self, dst, size, offset=0, stream=None):
            n = size // dst.itemsize
            start = offset // dst.itemsize
            dst[...] = self.values[start:start + n].reshape(dst.shape)

    def unpack(function):
        params = [chainer.Parameter(np.zeros((2, 3), np.float16)),
                  chainer.Parameter(np.zeros(4, np.float32)),
                  chainer.Parameter(np.zeros(2, np.float16))]
        for p in params:
            p.grad = np.full_like(p.array, 7)
        received = (np.arange(12, dtype=np.float32) - 5) / 3
        function(params, 'grad', HostBuffer(received), np.float32, False)
        want = [received[:6].reshape(2, 3).astype(np.float16),
                received[6:10], received[10:].astype(np.float16)]
        for p, w in zip(params, want):
            assert p.grad.dtype == w.dtype and (p.grad == w).all(), (p.grad, w)
        return 'ok'

    result = {}
    original = mu.unpack_params
    try:
        result['original'] = unpack(original)
    except ValueError as e:
        result['original'] = 'ValueError: %s' % e
    compat.apply_chainermn()
    assert mu.unpack_params is not original
    result['patched'] = unpack(mu.unpack_params)
    result['applied'] = compat.applied['chainermn unpack_params']
    print(json.dumps(result))
'''


def test_chainermn_unpack_params_float16_through_float32():
    """``chainermn/communicators/_memory_utility.py::unpack_params`` (the
    ``flat`` and non-CUDA-aware communicators) widens float16 gradients with
    ``xp.array(v, copy=False, dtype=float32)``: NumPy 2 refuses a copy
    there; the patched function unpacks exactly."""
    out, _ = _ok('import ada_loss\n' +
                 textwrap.dedent(_UNPACK))
    result = json.loads(out.strip().splitlines()[-1])
    if isinstance(result, str):
        pytest.skip(result)
    assert result['original'].startswith('ValueError'), result
    assert 'copy' in result['original'], result
    assert result['patched'] == 'ok' and result['applied'] is True


def test_create_communicator_applies_chainermn_patch():
    out, _ = _ok('''
        import ada_loss  # NOQA
        if importlib.util.find_spec('mpi4py') is None:
            print(json.dumps('mpi4py not installed (./scripts/install.sh '
                             'mpi)'))
            sys.exit(0)
        from ada_loss.training.distributed import create_communicator
        comm = create_communicator('naive')
        import chainermn.communicators._memory_utility as mu
        print(json.dumps(mu.unpack_params._ada_loss_compat))
    ''')
    result = json.loads(out.strip().splitlines()[-1])
    if isinstance(result, str):
        pytest.skip(result)
    assert result is True


# ---------------------------------------------- CuPy 14 (no cuDNN at all)

_CUDA = '''
    import types
    import ada_loss
    assert ada_loss.chainer is not None
    from chainer.backends import cuda
    # A CUDA-capable Chainer whose CuPy has no cuDNN (simulated on CPU)
    cuda.available, cuda.cudnn_enabled = True, False
    cuda._cudnn_disabled_by_user = False
    sys.modules['cupy'] = types.SimpleNamespace(__version__=VERSION)
    if PATCH:
        compat.apply_cuda()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        cuda.check_cuda_available()
    print(json.dumps([str(x.message).splitlines()[0] for x in w]))
'''


@pytest.mark.parametrize('version, patch, warned', [
    ('14.0.0', False, True),    # without the patch: unfollowable advice
    ('14.0.0', True, False),
    ('13.6.0', True, True),     # CuPy 13 can have cuDNN: the advice stands
])
def test_cupy14_without_cudnn_is_not_a_warning(version, patch, warned):
    """Chainer 7.8.1 warns "cuDNN is not enabled. Please reinstall CuPy
    after you install cudnn" at the first GPU kernel
    (``chainer/backends/cuda.py::check_cuda_available``); CuPy >= 14 has no
    cuDNN to install."""
    code = textwrap.dedent(_CUDA).replace('VERSION', repr(version)).replace(
        'PATCH', repr(patch))
    out, _ = _ok(code)
    messages = json.loads(out.strip().splitlines()[-1])
    assert messages == (['cuDNN is not enabled.'] if warned else [])


@pytest.mark.gpu
def test_gpu_kernels_with_cupy14_give_no_cudnn_advice():
    """On a GPU machine (``scripts/gpu_check.sh``): Chainer's GPU kernels
    run on CuPy >= 14 and say nothing about cuDNN."""
    rc, out, err = _child('''
        import json, sys
        import ada_loss, chainer, chainer.functions as F
        from chainer.backends import cuda
        if not cuda.available:
            print(json.dumps('no CUDA for Chainer: %r'
                             % getattr(cuda, '_resolution_error', None)))
            sys.exit(0)
        import cupy
        if int(cupy.__version__.split('.')[0]) < 14:
            print(json.dumps('CuPy %s (< 14: may have cuDNN)'
                             % cupy.__version__))
            sys.exit(0)
        x = chainer.Variable(cupy.ones((1, 2, 5, 5), 'f'))
        W = chainer.Variable(cupy.ones((3, 2, 3, 3), 'f'))
        F.sum(F.relu(F.convolution_2d(x, W))).backward()
        assert float(W.grad.sum()) == 3 * 2 * 9 * 9
        print(json.dumps(ada_loss._chainer_compat.applied))
    ''', flags=['-W', 'error::UserWarning'], prelude=False)
    if rc == 0 and isinstance(json.loads(out.strip().splitlines()[-1]), str):
        pytest.skip(json.loads(out.strip().splitlines()[-1]))
    assert rc == 0, err[-4000:]
    applied = json.loads(out.strip().splitlines()[-1])
    assert applied.get('cuda: no cuDNN in CuPy >= 14') is True
    assert err == '', err[-4000:]


# ---------------------------------------------------- the start-up hook

def _hook_path():
    return os.path.join(sysconfig.get_paths()['purelib'],
                        'ada_loss_chainer_compat.pth')


def test_startup_hook_is_installed_for_this_checkout():
    path = _hook_path()
    assert os.path.exists(path), (
        '%s missing: run ./scripts/install.sh' % path)
    import importlib.util
    spec = importlib.util.spec_from_file_location('_compat', COMPAT)
    compat = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compat)
    with open(path) as f:
        assert f.read() == compat.startup_line(), (
            '%s loads another checkout: run ./scripts/install.sh' % path)


def test_chainer_imported_before_ada_loss():
    """Without the hook, ``import chainer`` fails inside Chainer on NumPy 2;
    with it (the installed one), Chainer then ada_loss import cleanly."""
    err = _fails('import chainer\n')          # the prelude drops the hook
    assert 'AttributeError' in err and 'sctypes' in err, err[-2000:]
    out, err = _ok('''
        compat.install_import_hook()          # what the start-up hook runs
        import chainer
        assert compat.applied['numpy.sctypes']
        import ada_loss
        assert hasattr(ada_loss, 'AdaLossScaled')
        print('ok')
    ''', flags=['-W', 'error::UserWarning', '-W', 'error::RuntimeWarning'])
    assert out.strip() == 'ok' and err == '', err[-4000:]
    if not os.path.exists(_hook_path()):
        pytest.fail('start-up hook missing: run ./scripts/install.sh')
    code = '''
        import chainer
        import chainer.functions as F, numpy as np
        assert F.relu(np.float32([-1, 2])).array.tolist() == [0, 2]
        import ada_loss
        assert hasattr(ada_loss, 'AdaLossScaled')
        print('ok')
    '''
    rc, out, err = _child(code, flags=['-W', 'error::UserWarning', '-W',
                                       'error::RuntimeWarning', '-W',
                                       'error::FutureWarning'], prelude=False)
    assert rc == 0 and out.strip() == 'ok' and err == '', err[-4000:]
    rc, out, err = _child(code, prelude=False)    # default filters
    assert rc == 0 and out.strip() == 'ok' and err == '', err[-4000:]


def test_import_ada_loss_emits_no_warning_at_all():
    """``import ada_loss`` with every warning an error, DeprecationWarnings
    included (Chainer's own ones about its packaging are kept inside)."""
    rc, out, err = _child('''
        import ada_loss, chainer
        from ada_loss import training, scaling, adaptive, loss_scale  # NOQA
        print('ok')
    ''', flags=['-W', 'error'], prelude=False)
    assert rc == 0 and out.strip() == 'ok' and err == '', err[-4000:]
