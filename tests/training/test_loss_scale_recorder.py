"""loss_scales.csv after a resume: rows of the redone iterations and torn
rows (a kill while appending) are dropped by the first call."""
import csv

from ada_loss.training.extensions import LossScaleRecorder


def test_sync_drops_redone_and_incomplete_rows(tmp_path):
    path = str(tmp_path / 'loss_scales.csv')
    with open(path, 'w') as f:
        f.write('iteration,layer,alpha,beta\n1,fc,1.0,1.0\n2,fc,2.0,1.0\n'
                '3,fc,4.0,1.0\n4,fc,8.')               # torn last row
    LossScaleRecorder(None)._sync(path, 3)
    rows = list(csv.reader(open(path)))
    assert rows == [['iteration', 'layer', 'alpha', 'beta'],
                    ['1', 'fc', '1.0', '1.0'], ['2', 'fc', '2.0', '1.0']]
    with open(path, 'w') as f:
        f.write('iteration,layer,alpha,beta\n1,fc,1.0,1.0\n2,fc')
    LossScaleRecorder(None)._sync(path, 5)
    assert list(csv.reader(open(path)))[1:] == [['1', 'fc', '1.0', '1.0']]
