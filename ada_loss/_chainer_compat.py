"""Chainer 7.8.1 / ChainerCV 0.13.1 / ChainerMN on today's stack.

Chainer 7.8.1 (2020) predates NumPy 2, Python 3.12, setuptools 82 and CuPy 14.
This module patches exactly what such a stack lacks, nothing else, and never
edits installed files. Each patch names the file it serves; each has a test in
``tests/test_chainer_compat.py`` that fails without it.

* ``numpy.sctypes`` (removed in NumPy 2.0) — read at import by
  ``chainer/functions/array/as_strided.py``.
* ``numpy.distutils.system_info`` (``numpy.distutils`` is gone on Python
  >= 3.12) — imported by ``chainer/_environment_check.py``, which calls
  ``numpy.distutils.system_info.get_info`` on macOS only: a module (also set
  as ``numpy.distutils``) whose ``get_info`` finds no BLAS information.
* ``pkg_resources`` (removed in setuptools 82) — imported by
  ``chainer/_environment_check.py`` to warn about CuPy/iDeep versions outside
  Chainer 7's ranges. Without it that optional check is replaced by one that
  checks nothing (no CuPy 7 exists for today's Pythons anyway).
* ``chainermn/communicators/_memory_utility.py::unpack_params`` calls
  ``xp.array(v, copy=False, dtype=...)``, which NumPy 2 refuses when a copy is
  needed (float16 gradients through the ``flat`` or a non-CUDA-aware
  communicator): the same function with ``xp.asarray``.
* CuPy >= 14 has no cuDNN at all (``cupy.cudnn`` is gone). Chainer 7.8.1 falls
  back to its im2col/cuBLAS paths and warns "cuDNN is not enabled" at the first
  kernel, advice that cannot be followed: ``CHAINER_CUDNN=0`` (Chainer's own
  switch) is set before Chainer is imported, and where Chainer already was,
  the warning is marked as given.

:func:`apply` runs before Chainer is imported: by ``import ada_loss`` and, when
``scripts/install.sh`` wrote the start-up hook (:func:`write_startup_hook`), at
interpreter start for a program that imports ``chainer`` before ``ada_loss``.
It only uses the standard library at import, so the hook can load this file on
its own without importing the ``ada_loss`` package (which imports Chainer).
That is why its other imports are made inside the patches that need them:
NumPy (about 0.1 s, which every interpreter start of the environment would
pay), Chainer (which must come *after* the patches), ``pkg_resources``
(importing it under a warnings filter is the patch) and ``importlib.metadata``
(read only when CuPy is installed), and CuPy, which is optional.
"""
import importlib.abc
import importlib.util
import os
import sys
import types
import warnings

_STARTUP_PTH = 'ada_loss_chainer_compat.pth'

# What each patch did, for the report and the tests: name -> True once applied.
applied = {}


def _numpy_sctypes():
    import numpy
    if 'sctypes' in numpy.__dict__:
        return
    # NumPy 1.x's table, as Chainer reads it (itemsize -> signed int type).
    numpy.sctypes = {
        'int': [numpy.int8, numpy.int16, numpy.int32, numpy.int64],
        'uint': [numpy.uint8, numpy.uint16, numpy.uint32, numpy.uint64],
        'float': [numpy.float16, numpy.float32, numpy.float64,
                  numpy.longdouble],
        'complex': [numpy.complex64, numpy.complex128, numpy.clongdouble],
        'others': [bool, object, bytes, str, numpy.void],
    }
    applied['numpy.sctypes'] = True


def _module_missing(name):
    if name in sys.modules:
        return sys.modules[name] is None
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


def _numpy_distutils():
    if not _module_missing('numpy.distutils'):
        return
    package = types.ModuleType('numpy.distutils')
    package.__path__ = []
    package.__doc__ = 'Stand-in by ada_loss._chainer_compat (Python >= 3.12).'
    system_info = types.ModuleType('numpy.distutils.system_info')
    system_info.get_info = lambda name, notfound_action=0: {}
    package.system_info = system_info
    sys.modules['numpy.distutils'] = package
    sys.modules['numpy.distutils.system_info'] = system_info
    # Chainer reads it as an attribute, numpy.distutils.system_info.get_info,
    # which the import statement sets only for a module it loads itself.
    import numpy
    numpy.distutils = package
    applied['numpy.distutils.system_info'] = True


def _environment_check():
    if not _module_missing('pkg_resources'):
        return
    check = types.ModuleType('chainer._environment_check')
    check.__doc__ = ("Stand-in by ada_loss._chainer_compat: pkg_resources is "
                     "gone (setuptools >= 82); Chainer's optional-package "
                     "version check is skipped.")
    check.check = lambda: None
    sys.modules['chainer._environment_check'] = check
    applied['chainer._environment_check'] = True


def _quiet_pkg_resources():
    # setuptools 81's pkg_resources warns at import that it is deprecated;
    # Chainer imports it for its own packaging check, not the user's code.
    if 'pkg_resources' in sys.modules or _module_missing('pkg_resources'):
        return
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        import pkg_resources  # NOQA


def apply_chainermn():
    """Patches ChainerMN's ``unpack_params`` (call after importing
    ``chainermn``)."""
    mu = sys.modules.get('chainermn.communicators._memory_utility')
    if mu is None or getattr(mu.unpack_params, '_ada_loss_compat', False):
        return
    import chainer

    def unpack_params(params, attr_name, buffer, transfer_dtype, zero_fill,
                      stream=None):
        if len(params) == 0:
            return
        xp = chainer.backend.get_array_module(getattr(params[0], attr_name))
        offset = 0
        for param in params:
            v = getattr(param, attr_name)
            if attr_name == 'grad' and v is None and zero_fill:
                v = param.xp.empty_like(param.data)
                setattr(param, attr_name, v)
            size = v.size * mu.np.dtype(transfer_dtype).itemsize
            grad_dtype = v.dtype
            if grad_dtype != transfer_dtype:
                v = xp.asarray(v, dtype=transfer_dtype)  # copy=False in 7.8.1
            buffer.to_device(v, size, offset, stream)
            offset += size
            if grad_dtype != transfer_dtype:
                getattr(param, attr_name)[...] = v.astype(grad_dtype)

    unpack_params._ada_loss_compat = True
    unpack_params.__doc__ = mu.unpack_params.__doc__
    mu.unpack_params = unpack_params
    applied['chainermn unpack_params'] = True


def apply_cuda():
    """Marks Chainer's unfollowable "cuDNN is not enabled" warning as given
    when the installed CuPy has no cuDNN at all (CuPy >= 14)."""
    cuda = sys.modules.get('chainer.backends.cuda')
    if cuda is None or not cuda.available or cuda.cudnn_enabled:
        return
    import cupy
    if int(cupy.__version__.split('.')[0]) >= 14:
        cuda.check_cuda_available._already_warned = True
        applied['cuda: no cuDNN in CuPy >= 14'] = True


def _cupy_without_cudnn():
    # CuPy >= 14 has no cuDNN at all; Chainer 7.8.1 then uses its im2col /
    # cuBLAS paths anyway, but warns "cuDNN is not enabled ... reinstall
    # CuPy" at its first kernel, advice nobody can follow. CHAINER_CUDNN=0
    # is Chainer's own switch for "no cuDNN": the same paths, no warning.
    if 'chainer' in sys.modules or 'CHAINER_CUDNN' in os.environ or \
            _module_missing('cupy'):
        return
    from importlib import metadata
    try:
        names = metadata.packages_distributions().get('cupy', [])
        majors = [int(metadata.version(n).split('.')[0]) for n in names]
    except Exception:   # an unreadable installation: leave Chainer as is
        return
    if majors and min(majors) >= 14:
        os.environ['CHAINER_CUDNN'] = '0'
        applied['CHAINER_CUDNN=0 (CuPy >= 14 has no cuDNN)'] = True


def apply():
    """Applies every patch this stack needs before Chainer is imported; the
    CuPy and ChainerMN ones also when Chainer already is."""
    _numpy_sctypes()
    _numpy_distutils()
    if 'chainer' not in sys.modules:
        _cupy_without_cudnn()
        _environment_check()
        _quiet_pkg_resources()
    apply_cuda()
    apply_chainermn()


class _BeforeChainer(importlib.abc.MetaPathFinder):
    """Applies :func:`apply` when ``chainer`` is first imported (start-up
    hook); finds nothing itself."""

    def find_spec(self, name, path=None, target=None):
        if name == 'chainer':
            sys.meta_path.remove(self)
            apply()
        return None


def install_import_hook():
    if not any(isinstance(f, _BeforeChainer) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeChainer())


def startup_line():
    """The one line of the ``.pth`` file that loads this file at start-up."""
    here = os.path.abspath(__file__)
    return ("import importlib.util as u; s = u.spec_from_file_location("
            "'ada_loss._chainer_compat', %r); m = u.module_from_spec(s); "
            "s.loader.exec_module(m); m.install_import_hook()\n" % here)


def write_startup_hook(site_packages):
    """Writes the start-up hook into ``site_packages``; returns its path."""
    path = os.path.join(site_packages, _STARTUP_PTH)
    with open(path, 'w') as f:
        f.write(startup_line())
    return path


if __name__ == '__main__':
    # python ada_loss/_chainer_compat.py --write-startup-hook (install.sh)
    import sysconfig
    if sys.argv[1:] != ['--write-startup-hook']:
        sys.exit('usage: python ada_loss/_chainer_compat.py '
                 '--write-startup-hook')
    print('[install] start-up hook:',
          write_startup_hook(sysconfig.get_paths()['purelib']))
