"""Shared by every test folder: ``tests/`` on ``sys.path`` (so the helper
modules here, ``ondisk_fixtures`` and ``substrate_helpers``, import by name
from any folder) and the session-wide tiny VOC devkit."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import ondisk_fixtures as fixtures  # NOQA


@pytest.fixture(scope='session')
def voc_root(tmp_path_factory):
    return fixtures.make_vocdevkit(str(tmp_path_factory.mktemp('voc')))
