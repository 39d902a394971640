"""build_ssd's pretrained weights (issue 50 item 5): a weights file whose
array is a pickled object runs no code (it was unpickled by Chainer's and
ChainerCV's ``load_npz``); the error names the file; a legitimate file
loads (round trip), partial weights keep the rest as initialized, and an
array of another shape or a key the model lacks is one error naming the
file and the key."""
import os

import chainer
import numpy
import pytest

from ada_loss.detection import build_ssd

from npz_payloads import write_hostile


def _arrays(model):
    saver = chainer.serializers.DictionarySerializer()
    saver.save(model)
    return {k: numpy.array(v) for k, v in saver.target.items()}


@pytest.fixture(scope='module')
def tiny_weights(tmp_path_factory):
    """A trained-looking ssd_tiny weights file (seed 1) and its arrays."""
    numpy.random.seed(1)
    model = build_ssd('ssd_tiny', 20, 'float32', initialize=True)
    path = str(tmp_path_factory.mktemp('w') / 'tiny.npz')
    chainer.serializers.save_npz(path, model)
    return path, _arrays(model)


@pytest.mark.parametrize('name, key', [
    ('ssd_tiny', 'extractor/conv1/W'),
    # ChainerCV's SSD300 / SSD512 loaded the file with its own load_npz
    ('ssd300', 'extractor/conv1_1/W'),
    ('ssd512', 'extractor/conv1_1/W')])
def test_hostile_weights_run_no_code(tmp_path, tiny_weights, name, key):
    marker = tmp_path / 'ran'
    arrays = tiny_weights[1] if name == 'ssd_tiny' else {}
    path = write_hostile(tmp_path / 'weights.npz', arrays, key, marker)
    try:
        build_ssd(name, 20, 'float32', pretrained_model=path)
        text = None
    except ValueError as e:
        text = str(e)
    assert not marker.exists(), 'loading the weights ran the code'
    assert text is not None, 'the hostile file was accepted'
    assert path in text and key in text and 'pickled' in text
    assert '\n' not in text


def test_weights_round_trip(tiny_weights):
    path, arrays = tiny_weights
    numpy.random.seed(2)        # another initialization: the file wins
    model = build_ssd('ssd_tiny', 20, 'float32', pretrained_model=path,
                      initialize=True)
    loaded = _arrays(model)
    assert sorted(loaded) == sorted(arrays)
    for k in arrays:
        assert loaded[k].tobytes() == arrays[k].tobytes(), k


def test_weights_into_mixed16(tiny_weights):
    """FP32 weights into an FP16 model: cast within the kind (as
    Chainer's copy does)."""
    path, arrays = tiny_weights
    model = build_ssd('ssd_tiny', 20, 'mixed16', pretrained_model=path)
    w = model.extractor.conv1.W.array
    assert w.dtype == numpy.float16
    assert numpy.array_equal(w, arrays['extractor/conv1/W'].astype(
        numpy.float16))


def test_partial_weights_keep_the_rest(tmp_path, tiny_weights):
    """A backbone only (the extractor): the multibox keeps its
    initialization, as ChainerCV's strict=False load did."""
    _, arrays = tiny_weights
    path = str(tmp_path / 'backbone.npz')
    numpy.savez(path, **{k: v for k, v in arrays.items()
                         if k.startswith('extractor/')})
    numpy.random.seed(2)
    ref = _arrays(build_ssd('ssd_tiny', 20, 'float32', initialize=True))
    numpy.random.seed(2)
    model = build_ssd('ssd_tiny', 20, 'float32', pretrained_model=path,
                      initialize=True)
    loaded = _arrays(model)
    for k in arrays:
        want = arrays[k] if k.startswith('extractor/') else ref[k]
        assert loaded[k].tobytes() == want.tobytes(), k


@pytest.mark.parametrize('change, key, expect', [
    # numpy.copyto broadcast a (1,) array into the whole weight
    ('shape', 'extractor/conv1/W', 'float32 of shape (1,), expected '
     'float32 of shape (8, 3, 3, 3)'),
    ('dtype', 'extractor/conv1/b', 'complex64 of shape (8,), expected '
     'float32 of shape (8,)'),
    ('extra', 'extractor/conv9/W', 'holds extractor/conv9/W that the '
     'TinySSD does not')])
def test_mismatched_weights_are_one_error(tmp_path, tiny_weights, change,
                                          key, expect):
    _, arrays = tiny_weights
    arrays = dict(arrays)
    if change == 'shape':
        arrays[key] = numpy.ones((1,), numpy.float32)
    elif change == 'dtype':
        arrays[key] = numpy.ones((8,), numpy.complex64)
    else:
        arrays[key] = numpy.ones((3,), numpy.float32)
    path = str(tmp_path / 'bad.npz')
    numpy.savez(path, **arrays)
    with pytest.raises(ValueError) as e:
        build_ssd('ssd_tiny', 20, 'float32', pretrained_model=path)
    text = str(e.value)
    assert text.startswith(path + ': ') and key in text and expect in text
    assert os.path.exists(path)


@pytest.mark.parametrize('precision', ['float32', 'mixed16'])
def test_a_lazily_initialized_weight_of_another_shape_is_one_error(
        tmp_path, tiny_weights, precision):
    """multibox/conf/0/W is created without its input channels (ChainerCV's
    Multibox; VGG-16's first convolution in SSD300/512 likewise): loaded
    into the model as built, it took whatever shape the file held -- here
    18 input channels for 16, loaded without a word and initialize_params
    passing, the error left to the first training step. The model's
    parameters now have their shapes before the file is read."""
    _, arrays = tiny_weights
    arrays = dict(arrays)
    key = 'multibox/conf/0/W'
    out, cin, kh, kw = arrays[key].shape
    arrays[key] = numpy.zeros((out, cin + 2, kh, kw), numpy.float32)
    path = str(tmp_path / 'bad.npz')
    numpy.savez(path, **arrays)
    with pytest.raises(ValueError) as e:
        build_ssd('ssd_tiny', 20, precision, pretrained_model=path,
                  initialize=True)
    assert str(e.value) == '{}: {} is float32 of shape ({}, {}, {}, {}), ' \
        'expected {} of shape ({}, {}, {}, {})'.format(
            path, key, out, cin + 2, kh, kw,
            'float32' if precision == 'float32' else 'float16',
            out, cin, kh, kw)
