"""scripts/cross_check_authors.py without the authors' code: the cases, the
float64 reference, our side and the comparison (their side needs a checkout
of kumasento/gradient-scaling: run the script itself, docs/authors.md)."""

import numpy as np
import pytest

from ada_loss.loss_scale.gemm import authors_loss_scale
from repo_modules import load

cc = load('scripts/cross_check_authors.py')


def test_grad_errors():
    ref = np.array([1.0, -2.0, 0.0, 4.0])
    rel, flushed = cc.grad_errors(ref * (1 + 1e-3), ref)
    assert rel == pytest.approx(1e-3, rel=1e-9) and flushed == 0.0
    g = np.array([1.0, 0.0, 0.0, 4.0])
    rel, flushed = cc.grad_errors(g, ref)
    assert rel == pytest.approx(2.0 / np.sqrt(21.0)) and \
        flushed == pytest.approx(1 / 3)
    rel, flushed = cc.grad_errors(np.array([np.nan, 0, 0, 1]), ref)
    assert rel == float('inf') and np.isnan(flushed)


def test_same_bits():
    a = np.array([0.0, 1.5], np.float16)
    assert cc.same_bits(a, a.copy())
    assert not cc.same_bits(a, np.array([-0.0, 1.5], np.float16))
    assert not cc.same_bits(a, a.astype(np.float32))
    assert not cc.same_bits(a, None)


def test_compare_and_table():
    ref = {'l1': np.ones(3), 'l2': np.ones(3)}
    rows = cc.compare('c', ['l1', 'l2'],
                      {'l1': (1.0, 4.0), 'l2': (4.0, 2.0)},
                      {'l1': (1.0, 4.0), 'l2': (4.0, 1.0)},
                      {'l1': np.ones(3), 'l2': np.zeros(3)}, ref, ref)
    assert [r.identical for r in rows] == [True, False]
    assert rows[1].flushed_theirs == 1.0 and rows[1].err_ours == 0.0
    # a layer one side did not report is a mismatch
    rows2 = cc.compare('c', ['l1'], {}, {'l1': (1.0, 1.0)}, {}, ref, ref)
    assert not rows2[0].identical
    text = cc.format_table(rows + rows2)
    assert '1 of 3 layers: α and β identical' in text
    assert text.count('**no**') == 2


def test_float64_reference_is_backprop():
    arrays = cc.make_case('mlp', 'small', seed=1)
    got = cc.float64_grads('mlp', arrays)
    f = {k: v.astype(np.float64) for k, v in arrays.items()}
    h1 = np.maximum(f['x'] @ f['l1/W'].T + f['l1/b'], 0)
    h2 = np.maximum(h1 @ f['l2/W'].T + f['l2/b'], 0)
    np.testing.assert_allclose(got['l3'], f['gy'].T @ h2, rtol=1e-12)
    g2 = (f['gy'] @ f['l3/W']) * (h2 > 0)
    np.testing.assert_allclose(got['l2'], g2.T @ h1, rtol=1e-12)


@pytest.mark.parametrize('net', cc.NETS)
def test_ours_last_layer_and_errors(net):
    arrays = cc.make_case(net, 'tiny', seed=0)
    last = cc.LAYERS[net][-1][0]
    scales, grads = cc.run_ours(net, arrays, cc.CAPS['cifar'])
    assert scales[last] == (1.0, authors_loss_scale(
        arrays[last + '/W'], arrays['gy'], max_layer_scale=128.0,
        max_accum_scale=4096.0))
    assert scales[last][1] == 128.0
    ref = cc.float64_grads(net, arrays)
    for name, *_ in cc.LAYERS[net][:-1]:     # scaled: small error
        assert cc.grad_errors(grads[name], ref[name])[0] < 0.05
    gx, scale = grads['(input)']
    assert gx.dtype == np.float16 and scale == np.prod(
        [scales[n][1] for n, *_ in cc.LAYERS[net]])


def test_needs_a_checkout(tmp_path):
    with pytest.raises(SystemExit):
        cc.main(['--reference', str(tmp_path)])


def test_sequence_case_reuses_then_recomputes():
    arrays = cc.make_case('mlp', 'seq', seed=0)
    gys = cc.loss_gradients(arrays)
    assert len(gys) == 3 and cc.update_interval(arrays) == 2
    assert cc.update_interval(cc.make_case('mlp', 'tiny')) == 1
    # the first pass's loss gradient is the tiny case's
    assert cc.same_bits(gys[0], cc.make_case('mlp', 'tiny')['gy'])
    ref = cc.float64_grads('mlp', arrays)
    assert set(ref) == {cc.layer_label(n, i) for i in range(3)
                        for n in ('l1', 'l2', 'l3')}
    scales, grads = cc.run_ours('mlp', arrays, cc.CAPS['default'])
    # pass 1 reuses pass 0's beta (a small gradient at the tiny one's scale)
    assert scales['l3@1'] == scales['l3'] == (1.0, 16.0)
    assert scales['l3@2'] == (1.0, authors_loss_scale(
        arrays['l3/W'], gys[2], max_layer_scale=16.0, max_accum_scale=1024.0))
    assert scales['l2@2'][1] < 1     # the huge gradient: their fan bound
    assert cc.grad_errors(grads['l1@1'], ref['l1@1'])[0] < 1e-2


def test_their_paths_map_to_ours():
    """Every parameter of their ResNetCIFAR(20) under their AdaLossScaled
    maps to one of CifarResNet(20, shortcut='authors') (their paths written
    out from their model at 0ca4354: conv1/conv, conv1/bn, res<k>/a with a
    residual projection, res<k>/b<i>, fc6)."""
    theirs = ['/link/conv1/conv/W', '/link/conv1/bn/gamma',
              '/link/conv1/bn/beta', '/link/fc6/W', '/link/fc6/b']
    for k in (2, 3, 4):
        for block in ('a', 'b0', 'b1'):
            for conv in ('conv1', 'conv2') + (('residual',) if block == 'a'
                                               else ()):
                base = '/link/res{}/{}/{}/'.format(k, block, conv)
                theirs += [base + 'conv/W', base + 'bn/gamma',
                           base + 'bn/beta']
    arrays = cc.make_resnet_case('small', seed=0)
    ours = {k for k in arrays if k not in ('x', 'gy')}
    mapped = [cc.their_to_our_path(p) for p in theirs]
    assert sorted(mapped) == sorted(ours)
    assert cc.their_to_our_path('/link/res3/b1/conv2/conv') == 'res3/2/conv2'
    assert len(cc.resnet_gemm_paths(arrays)) == 23
