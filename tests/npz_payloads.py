"""Hostile ``.npz`` files for the loaders' tests (issue 50 item 5): an
array stored as a pickled Python object whose unpickling runs code (it
writes a marker file). :func:`write_hostile` checks that the file it
writes really runs the code when unpickled (as Chainer 7.8.1's
``load_npz`` does, ``allow_pickle=True``), so that a test finding no
marker after a load shows the loader's safety, not a harmless file."""
import os

import numpy


class RunsCode(object):
    """Unpickled, it calls ``exec`` on code that writes ``marker``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return exec, ("open({!r}, 'w').write('ran')".format(self.marker),)


def write_hostile(path, arrays, key, marker):
    """Writes ``arrays`` with ``key`` replaced by (or added as) an object
    array holding :class:`RunsCode` to the ``.npz`` ``path``; returns
    ``path``. Asserts that unpickling it runs the code (then removes the
    marker again)."""
    arrays = dict(arrays)
    hostile = numpy.empty((), object)
    hostile[()] = RunsCode(str(marker))
    arrays[key] = hostile
    with open(str(path), 'wb') as f:
        numpy.savez(f, **arrays)
    with numpy.load(str(path), allow_pickle=True) as npz:
        npz[key]
    assert os.path.exists(str(marker)), 'the payload did not run'
    os.remove(str(marker))
    return str(path)
