import os

import numpy
import pytest

from ada_loss.datasets import DatasetNotFoundError
from ada_loss.datasets.voc import (
    VOC_LABEL_NAMES, get_voc_detection_test, get_voc_detection_train,
    voc_bbox_dataset)


def test_voc0712_trainval_and_07_test(voc_root):
    train = get_voc_detection_train(voc_root)
    assert len(train) == 4                       # 2 images x (2007, 2012)
    img, bbox, label = train[0]
    assert img.shape == (3, 64, 80) and img.dtype == numpy.float32
    # The difficult chair is dropped for training; 1-based -> 0-based boxes.
    numpy.testing.assert_array_equal(bbox, [[7, 9, 49, 59]])
    assert [VOC_LABEL_NAMES[i] for i in label] == ['dog']
    test = get_voc_detection_test(voc_root)
    img, bbox, label, difficult = test[0]
    assert [VOC_LABEL_NAMES[i] for i in label] == ['dog', 'chair']
    assert list(difficult) == [False, True]
    # root may be the VOCdevkit folder itself
    assert len(voc_bbox_dataset(os.path.join(voc_root, 'VOCdevkit'), '2007',
                                'test')) == 2


def test_missing_voc_is_a_clear_error(voc_root, tmp_path):
    for root in (None, 'auto', str(tmp_path / 'nowhere')):
        with pytest.raises(DatasetNotFoundError, match='VOCdevkit'):
            get_voc_detection_train(root)
    with pytest.raises(DatasetNotFoundError, match='VOC2012 test'):
        voc_bbox_dataset(voc_root, '2012', 'test')
    with pytest.raises(DatasetNotFoundError, match='no VOC2007'):
        get_voc_detection_test(str(tmp_path))
