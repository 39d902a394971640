"""The FP8 diagnosis entry on the one run path: probed runs of the precision
table (``log.probe_every``), then per cell ``records.csv`` (every mode's
``probe.csv``), ``summary.csv``, ``diagnosis.png`` and ``modes.md``."""
import csv
import os

from ada_loss.analysis import gemm_probe
from ada_loss.experiment import runner
from ada_loss.experiment.studies import fp8_diagnosis

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _text_rows(path):
    with open(path, newline='') as f:
        return list(csv.reader(f))[1:]


def test_diagnosis_of_probed_runs(tmp_path, capsys):
    out = str(tmp_path)
    sets = ['grid.modes=[none, "adaptive:init_scale=auto"]',
            'grid.fixed_scales=[256]', 'train.epochs=1', 'train.lr_steps=[]',
            'log.probe_every=10', 'log.snapshot_interval=1 epoch']
    argv = ['--config', os.path.join(ROOT, 'configs', 'fp8_diagnosis.yaml'),
            '--out', out, '--jobs', '1'] + sum((['--set', s] for s in sets),
                                                [])
    assert runner.main(fp8_diagnosis.STUDY, argv) == 0
    table = os.path.join(out, 'fp8_diagnosis')
    runs = os.path.join(table, 'fp8_e4m3')
    modes = ['none', 'fixed:256', 'adaptive:init_scale=auto']
    probes = []
    for name in ('none', 'fixed_256', 'adaptive_init_scale=auto'):
        path = os.path.join(runs, 'resnet8-digits-{}-s0'.format(name),
                            'probe.csv')
        rows = gemm_probe.load_csv(path)
        # 23 steps: probed at 1, 10, 20; ResNet-8 has 8 GEMM layers
        assert sorted({r['iteration'] for r in rows}) == [1, 10, 20]
        assert len(rows) == 3 * 8
        probes += _text_rows(path)
    cell = os.path.join(table, 'diagnosis', 'fp8_e4m3-resnet8-digits-s0')
    assert _text_rows(os.path.join(cell, 'records.csv')) == probes
    with open(os.path.join(cell, 'summary.csv')) as f:
        summary = list(csv.DictReader(f))
    assert {(r['mode'], r['layer_id']) for r in summary} == {
        (m, str(i)) for m in modes for i in range(8)}
    # without scaling most of the gradient entering the GEMMs behind the
    # classifier underflows in FP8; with adaptive scaling little does
    uf = {m: max(float(r['uf_in']) for r in summary
                 if r['mode'] == m and r['layer_id'] != '0') for m in modes}
    assert uf['none'] > 0.9 and uf['adaptive:init_scale=auto'] < 0.2
    assert os.path.getsize(os.path.join(cell, 'diagnosis.png')) > 10000
    with open(os.path.join(table, 'modes.md')) as f:
        text = f.read()
    assert all('| {} |'.format(m) in text for m in modes)
    printed = capsys.readouterr().out
    assert 'Every mode' in printed and 'diagnosis/fp8_e4m3' in printed
