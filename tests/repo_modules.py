"""A repository file that is not in a package (``scripts/*.py``,
``experiments/*.py``) loaded as a module, for the tests of its functions.
``tests/`` is on ``sys.path`` (tests/conftest.py): ``from repo_modules
import load``."""
import importlib.util
import os

#: the repository's root folder
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(relpath, name=None):
    """The module of ``ROOT/relpath`` (named ``name``, default: the file's
    name without ``.py``), executed once per call."""
    path = os.path.join(ROOT, relpath)
    name = name or os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
