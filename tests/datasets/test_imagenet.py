import os

import numpy
import pytest

import ondisk_fixtures as fixtures
from ada_loss.datasets import DatasetFormatError, DatasetNotFoundError
from ada_loss.datasets.imagenet import (
    ImageNetEvalTransform, ImageNetTrainTransform, get_imagenet,
    get_imagenet_datasets, read_val_labels)


def test_folder_layout(tmp_path):
    root = fixtures.make_imagenet(str(tmp_path))
    train = get_imagenet(root, 'train')
    val = get_imagenet(root, 'val')
    assert train.label_names == fixtures.WNIDS
    assert len(train) == 6 and list(train.labels) == [0, 0, 1, 1, 2, 2]
    img, label = train[2]
    assert img.shape == (3, 40, 50) and img.dtype == numpy.float32
    assert label == 1
    # val/ folders re-indexed in train's order (all three present here).
    assert sorted(int(val[i][1]) for i in range(3)) == [0, 1, 2]
    for i in range(3):
        name = os.path.basename(os.path.dirname(val.img_paths[i]))
        assert fixtures.WNIDS[val[i][1]] == name


@pytest.mark.parametrize('style', ['index', 'wnid'])
def test_flat_val_with_labels_file(tmp_path, style):
    root = fixtures.make_imagenet(str(tmp_path), flat_val=True,
                                  label_style=style)
    val = get_imagenet(root, 'val')
    assert [int(val[i][1]) for i in range(3)] == [2, 1, 0]
    img, _ = val[0]                      # a grayscale JPEG, read as RGB
    assert img.shape == (3, 60, 30)


def test_loc_val_solution_csv(tmp_path):
    path = tmp_path / 'LOC_val_solution.csv'
    path.write_text('ImageId,PredictionString\n'
                    'ILSVRC2012_val_00000001,n01443537 1 2 3 4 n01443537 5 '
                    '6 7 8\n')
    assert read_val_labels(str(path), list(fixtures.WNIDS)) == {
        'ILSVRC2012_val_00000001': 1}


def test_transforms(tmp_path):
    root = fixtures.make_imagenet(str(tmp_path))
    train, val = get_imagenet_datasets(root)
    x, t = train[0]
    assert x.shape == (3, 224, 224) and x.dtype == numpy.float32
    x, t = val[0]
    assert x.shape == (3, 224, 224) and abs(float(x.mean())) < 3
    small = ImageNetTrainTransform(size=16)((train._dataset[0]))
    assert small[0].shape == (3, 16, 16)
    assert ImageNetEvalTransform(16, 20)(val._dataset[0])[0].shape == (
        3, 16, 16)


def test_missing_data_errors(tmp_path):
    with pytest.raises(DatasetNotFoundError, match='train/<wnid>'):
        get_imagenet(str(tmp_path / 'nowhere'))
    with pytest.raises(DatasetNotFoundError, match='train'):
        get_imagenet(str(tmp_path))
    root = fixtures.make_imagenet(str(tmp_path / 'a'), flat_val=True)
    os.remove(os.path.join(root, 'val.txt'))
    with pytest.raises(DatasetNotFoundError, match='labels file'):
        get_imagenet(root, 'val')
    with open(os.path.join(root, 'val.txt'), 'w') as f:
        f.write('ILSVRC2012_val_00000001.JPEG n99999999\n')
    with pytest.raises(DatasetFormatError, match='wnid'):
        get_imagenet(root, 'val')


def test_train_augmentation_is_reproducible_in_workers_and_on_resume(
        tmp_path):
    """The ImageNet runner's iterator (one seed per example): the random
    crops and flips are the same in worker processes as in this process,
    and continue exactly after a snapshot."""
    import chainer
    from ada_loss.datasets.imagenet import get_imagenet_datasets
    from ada_loss.experiment.iterators import make_iterator
    train, _ = get_imagenet_datasets(
        fixtures.make_imagenet(str(tmp_path), n_per_class=2), 16, 20)

    def take(it, n):
        return [numpy.stack([x for x, _ in next(it)]) for _ in range(n)]
    serial = make_iterator(train, 4, 0, seed=3)
    want = take(serial, 4)                   # 6 images: crosses epochs
    pooled = make_iterator(train, 4, 2, seed=3)
    try:
        got = take(pooled, 4)
    finally:
        pooled.finalize()
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want))
    assert want[0].tobytes() != want[1][:len(want[0])].tobytes()
    saved = chainer.serializers.DictionarySerializer()
    resumed = make_iterator(train, 4, 0, seed=3)
    take(resumed, 2)
    resumed.serialize(saved)
    other = make_iterator(train, 4, 0, seed=4)
    other.serialize(chainer.serializers.NpzDeserializer(saved.target))
    assert all(a.tobytes() == b.tobytes()
               for a, b in zip(take(other, 2), want[2:]))
