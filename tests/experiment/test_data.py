"""Datasets of a run: preprocessing, subsets, and missing files reported
before anything trains."""
import gzip
import os

import numpy
import pytest

from ada_loss.experiment.config import load
from ada_loss.experiment.data import load_datasets
from functools import partial

from ada_loss.experiment import runner
from ada_loss.experiment.studies.classification import STUDY

main = partial(runner.main, STUDY)


def write_idx(path, array):
    array = numpy.asarray(array, numpy.uint8)
    header = (0x0800 + array.ndim).to_bytes(4, 'big') + b''.join(
        d.to_bytes(4, 'big') for d in array.shape)
    with gzip.open(str(path), 'wb') as f:
        f.write(header + array.tobytes())


def test_digits_normalized_and_subset():
    cfg = load(STUDY.Config, raw={'data': {'train_size': 100, 'test_size': 50}})
    train, test = load_datasets('digits', cfg.data)
    assert (len(train), len(test)) == (100, 50)
    x = numpy.stack([train[i][0] for i in range(100)])
    assert x.shape == (100, 1, 16, 16) and x.dtype == numpy.float32
    assert abs(float(x.mean())) < 0.3 and 0.7 < float(x.std()) < 1.3


def test_fashion_mnist_from_idx_files(tmp_path):
    rng = numpy.random.RandomState(0)
    for prefix, n in (('train', 40), ('t10k', 20)):
        write_idx(tmp_path / ('%s-images-idx3-ubyte.gz' % prefix),
                  rng.randint(0, 256, (n, 28, 28)))
        write_idx(tmp_path / ('%s-labels-idx1-ubyte.gz' % prefix),
                  numpy.arange(n) % 10)
    cfg = load(STUDY.Config, raw={'data': {'fashion_mnist_root': str(tmp_path)}})
    train, test = load_datasets('fashion_mnist', cfg.data)
    assert (len(train), len(test)) == (40, 20)
    x, t = train[3]
    assert x.shape == (1, 28, 28) and x.dtype == numpy.float32 and t == 3
    xs = numpy.stack([train[i][0] for i in range(40)])
    assert abs(float(xs.mean())) < 1e-3 and abs(float(xs.std()) - 1) < 1e-3


@pytest.mark.parametrize('dataset, key', [('cifar10', 'cifar_root'),
                                          ('fashion_mnist',
                                           'fashion_mnist_root')])
def test_missing_files_fail_before_training(dataset, key, tiny_config,
                                            out_dir, tmp_path, capsys):
    path = tiny_config(grid={'datasets': [dataset]},
                       data={key: str(tmp_path / 'nothing')})
    assert main(['--config', path, '--out', out_dir]) == 2
    assert 'not found' in capsys.readouterr().err
    assert not os.path.exists(out_dir)


def test_subset_indices_are_the_examples_the_subset_holds():
    """data.subset_indices names the examples train_size selects (scripts
    draw a run's own training images by it)."""
    from ada_loss.experiment import data as Dt
    ds = list(range(100, 200))
    sub = Dt._subset(ds, 10, 3)
    assert [sub[i] for i in range(10)] == \
        [ds[i] for i in Dt.subset_indices(100, 10, 3)]
    assert list(Dt.subset_indices(5, None, 0)) == [0, 1, 2, 3, 4]
    assert list(Dt.subset_indices(5, 9, 0)) == [0, 1, 2, 3, 4]


# -- the selection split (issue 47) -------------------------------------------
@pytest.mark.parametrize('n, train_size, val_size', [
    (100, 30, 20), (100, 90, 20), (100, None, 20), (50, 49, 1),
    (1000, 100, 900)])
def test_selection_split_is_disjoint_from_training(n, train_size, val_size):
    from ada_loss.experiment.data import split_indices, subset_indices
    train, val = split_indices(n, train_size, val_size, seed=3)
    assert len(val) == val_size and len(set(val)) == val_size
    assert not set(train) & set(val)
    expected = min(train_size or n, n - val_size) if \
        n - (train_size or n) < val_size else train_size
    assert len(train) == expected
    if train_size is not None and n - train_size >= val_size:
        # enough images outside the subset: the subset is unchanged
        assert list(train) == list(subset_indices(n, train_size, 3))


def test_selection_split_refuses_all_of_the_data():
    from ada_loss.experiment.data import split_indices
    with pytest.raises(ValueError, match='data.val_size'):
        split_indices(10, None, 10, 0)


def test_selection_split_never_holds_a_test_or_training_image():
    """The images a choice is made on (the selection split) are training
    images, none of them trained on and none of them the test images the
    tables report: compared image by image."""
    cfg = load(STUDY.Config, raw={'data': {
        'train_size': 300, 'test_size': 200, 'val_size': 150}})
    train, test, val = load_datasets('digits', cfg.data, selection=True)
    assert (len(train), len(test), len(val)) == (300, 200, 150)

    def keys(ds):
        return {ds[i][0].tobytes() for i in range(len(ds))}
    k_train, k_test, k_val = keys(train), keys(test), keys(val)
    assert not k_val & k_train
    assert not k_val & k_test
    # without val_size: the same training and test subsets as before
    cfg0 = load(STUDY.Config, raw={'data': {'train_size': 300,
                                            'test_size': 200}})
    train0, test0 = load_datasets('digits', cfg0.data)
    assert keys(train0) == k_train and keys(test0) == k_test


def test_a_run_records_its_selection_accuracy(tiny_config, out_dir):
    import json
    path = tiny_config(data={'val_size': 40})
    assert main(['--config', path, '--out', out_dir, '--only', 'mode=fp32',
                 '--only', 'seed=0']) == 0
    infos = [json.load(open(os.path.join(d, 'run.json')))
             for d, _, files in os.walk(out_dir) if 'run.json' in files]
    assert infos and all(0.0 <= i['final_val_accuracy'] <= 1.0
                         for i in infos)
