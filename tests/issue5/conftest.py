import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import issue5_fixtures as fixtures  # NOQA


@pytest.fixture(scope='session')
def voc_root(tmp_path_factory):
    return fixtures.make_vocdevkit(str(tmp_path_factory.mktemp('voc')))
