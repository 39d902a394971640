"""The layering of the loss-scaling modes, training and the precision: what
imports what (the cycles that imports inside functions used to hide stay
gone).

    ada_loss.errors, ada_loss.precision      (pure data; formats only)
          ^                    ^
    ada_loss.training     ada_loss.scaling.methods <- ada_loss.scaling.modes

Training and scaling do not import each other; methods does not import
modes. Only optional dependencies are imported inside functions. (Read from
the source: at run time ``import ada_loss`` loads every layer first.)
"""
import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..',
                       'ada_loss')

#: imported where needed only: optional (mpi4py; ChainerMN's memory utility
#: imports mpi4py and starts MPI)
OPTIONAL = ('mpi4py', 'chainermn.communicators._memory_utility')


def _files(*parts):
    path = os.path.join(PACKAGE, *parts)
    if path.endswith('.py'):
        return [path]
    return sorted(os.path.join(path, n) for n in os.listdir(path)
                  if n.endswith('.py'))


def _imports(path):
    """[(module, inside_a_function)] of one file; relative imports are
    absolute here (the package uses none)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found = []

    def visit(node, inside):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((a.name, inside) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                assert child.level == 0, path
                found.extend(
                    ('{}.{}'.format(child.module, a.name), inside)
                    for a in child.names)
            visit(child, inside or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    visit(tree, False)
    return found


LAYERED = (_files('scaling') + _files('training') + _files('precision.py') +
           _files('errors.py'))


@pytest.mark.parametrize('path', LAYERED,
                         ids=lambda p: os.path.relpath(p, PACKAGE))
def test_only_optional_dependencies_are_imported_in_functions(path):
    late = [m for m, inside in _imports(path) if inside]
    assert [m for m in late if not m.startswith(OPTIONAL)] == []


def _ada_imports(paths):
    return {m for p in paths for m, _ in _imports(p)
            if m.startswith('ada_loss.')}


def test_import_directions():
    training = _ada_imports(_files('training'))
    assert not [m for m in training if m.startswith('ada_loss.scaling')]
    methods = _ada_imports(_files('scaling', 'methods.py'))
    assert not [m for m in methods if m.startswith('ada_loss.scaling.')]
    for low in ('precision.py', 'errors.py'):
        assert {m.rpartition('.')[0] for m in _ada_imports(_files(low))} <= \
            {'ada_loss.formats'}
    # the checks see imports at all: the known ones are found
    assert 'ada_loss.errors.NonFiniteGradientError' in training
    assert 'ada_loss.scaling.methods.AdaptiveScaling' in \
        _ada_imports(_files('scaling', 'modes.py'))
