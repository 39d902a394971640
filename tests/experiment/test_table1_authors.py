"""configs/table1_authors.yaml: Table 1 as the authors ran it
(kumasento/gradient-scaling examples/adaptive_loss_scaling/cifar)."""
import os

from ada_loss.experiment.studies.classification import STUDY
from ada_loss.adaptive.ada_loss_scaled import format_rule
from ada_loss.formats import get_format
from ada_loss.scaling import make_loss_scaling, resolve_precision

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def test_table1_authors_config():
    cfg = STUDY.load_config(
        os.path.join(ROOT, 'configs', 'table1_authors.yaml'), [])
    cells = STUDY.cells(cfg)
    # 3 depths x 2 datasets x (fp32, adaptive, 7 fixed scales) x 4 seeds
    assert len(cells) == 3 * 2 * 9 * 4
    modes = {str(c.mode) for c in cells}
    assert {m for m in modes if m.startswith('fixed')} == {
        'fixed:{}'.format(s) for s in (1, 16, 128, 1024, 4096, 8192, 16384)}
    (ada,) = [m for m in modes if m.startswith('adaptive')]
    method = make_loss_scaling(ada)
    o = method.options
    assert (o['style'], o['update_interval'], o['max_layer_scale'],
            o['max_accum_scale'], o['bound']) == (
        'authors', 1000, 128, 4096, 'fan_in')
    # the authors' α_{N+1} is the constant 1: the default rule (format)
    # keeps it in FP16 (mixed16), whatever the batch
    assert o['init_scale'] == 'format'
    assert {str(resolve_precision(ada, c.precision)) for c in cells
            if str(c.mode) == ada} == {'mixed16'}
    assert format_rule(get_format('float16'), cfg.train.batchsize) is None
    assert cfg.model.shortcut == 'authors'
    assert cfg.train.lr == 0.1 and cfg.train.lr_steps == [81, 122]
    # their warm-up: lr 0.01 for the first 5 epochs of 50000 / 128, depth 110
    r110 = cfg.for_model('resnet110').train
    assert (r110.warmup_iterations, r110.warmup_lr) == (1954, 0.01)
    assert -(-5 * 50000 // 128) == 1954
    assert cfg.for_model('resnet56').train.warmup_iterations == 0
