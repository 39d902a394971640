"""No table of any entry pools distinct runs (issue 39 item 1): a cell holds
the runs of exactly one (precision, mode with its canonical options, fixed
scale, model, dataset), whatever the spelling of the mode in ``run.json``;
a run that fits no column is listed in the footer, not dropped. Each layout
gets runs of two precisions, modes that share a column name (dynamic and
dynamic:style=chainer, adaptive and adaptive:init_scale=auto, amax and
amax:margin=2) and defaults written out or not."""
import itertools

import pytest

from ada_loss.experiment import runinfo as R
from ada_loss.experiment import tables as T
from ada_loss.experiment.studies import detection, imagenet
from ada_loss.scaling import parse_mode

#: (mode as run.json may spell it, seed): spellings of one mode on
#: different seeds, so that its cell must hold both
SPELLINGS = [
    ('none', 0), ('none', 1), ('fixed:16', 0), ('fixed:16', 1),
    ('fixed:256', 0), ('fixed:256', 1),
    ('dynamic', 0), ('dynamic:style=pytorch', 1),
    ('dynamic:style=chainer', 0), ('DYNAMIC:style=Chainer', 1),
    ('adaptive', 0), ('adaptive:guard=true', 1),
    ('adaptive:init_scale=auto', 0), ('adaptive:init_scale=AUTO', 1),
    ('adaptive:guard=false', 0), ('adaptive:guard=False', 1),
    ('amax', 0), ('amax:margin=8', 1), ('amax:margin=2', 0),
    ('amax:margin=2.0', 1)]
PRECISIONS = ('mixed16', 'fp8_e4m3')


def _runs(extra=None):
    """run.json dicts: every spelling in both precisions (distinct
    accuracies), one fp32 run in float32."""
    runs = []
    for i, ((mode, seed), precision) in enumerate(itertools.product(
            SPELLINGS, PRECISIONS)):
        spec = parse_mode(mode)
        runs.append(dict({
            'name': 'r{}-{}-{}'.format(i, mode, precision), 'mode': mode,
            'mode_name': spec.name, 'mode_options': spec.options,
            'seed': seed, 'precision': precision, 'model': 'resnet8',
            'dataset': 'digits', 'status': R.FINISHED,
            'final_test_accuracy': 0.5 + i / 1000.0,
            'final_map': 0.5 + i / 1000.0, 'batchsize': 8,
            'skipped_steps': i % 3}, **(extra or {})))
    runs.append({'name': 'fp32-run', 'mode': 'fp32', 'mode_name': 'fp32',
                 'mode_options': {}, 'seed': 0, 'precision': 'float32',
                 'model': 'resnet8', 'dataset': 'digits', 'batchsize': 8,
                 'status': R.FINISHED, 'final_test_accuracy': 0.9,
                 'final_map': 0.9})
    return runs


def _what(run):
    return (run['precision'], str(parse_mode(run['mode'])), run['model'],
            run['dataset'])


LAYOUTS = {
    'table1': T.table1, 'table4': T.table4, 'precision': T.precision_table,
    'table2_imagenet': imagenet.build_table,
    'table3_ssd': lambda runs: detection.build_table(runs, 'table3'),
    'table5_ssd': lambda runs: detection.build_table(runs, 'table5'),
}


@pytest.mark.parametrize('layout', sorted(LAYOUTS))
def test_no_cell_pools_distinct_runs(layout):
    runs = _runs()
    table = LAYOUTS[layout](runs)
    held = set()
    for cell in table.cells:
        stats = cell[-1]
        what = {_what(r) for r in stats.runs}
        assert len(what) <= 1, (layout, cell[:-1], what)
        held.update(id(r) for r in stats.runs)
    # every spelling of a mode is in the cell of its canonical mode: no
    # mode has more cells than it has (precision) rows
    per_what = {}
    for cell in table.cells:
        for r in cell[-1].runs:
            per_what.setdefault(_what(r), set()).add(id(cell[-1]))
    if layout in ('table1', 'precision', 'table2_imagenet', 'table3_ssd'):
        for what, cells in per_what.items():
            if what[1] != 'fp32' and not what[1].startswith('fixed:'):
                assert len(cells) == 1, (layout, what)
    # a run no cell holds is named in the footer (Table 4/5: only the
    # fixed runs belong there; Fixed (best) is chosen among them all)
    for r in runs:
        if id(r) not in held and not (layout in ('table4', 'table5_ssd')
                                      and r['mode_name'] != 'fixed') and \
                not ('Fixed (best)' in table.header and
                     r['mode_name'] == 'fixed'):
            assert r['name'] in table.footer, (layout, r['name'])


@pytest.mark.parametrize('layout', ['table1', 'precision', 'table2_imagenet',
                                    'table3_ssd'])
def test_modes_sharing_a_name_get_a_column_each(layout):
    table = LAYOUTS[layout](_runs())
    header = table.header
    for text in ('dynamic', 'dynamic:style=chainer', 'adaptive',
                 'adaptive:init_scale=auto', 'amax', 'amax:margin=2'):
        assert text in header, (layout, header)
    assert 'Adaptive (paper)' in header      # alone under its label
    assert 'Dynamic' not in header and 'Amax' not in header
    # two spellings of one mode, two seeds: n = 2 in every such cell
    for cell in table.cells:
        if cell[-2] in ('dynamic', 'adaptive', 'amax', 'amax:margin=2') \
                and cell[0] != 'float32':
            assert cell[-1].n == 2, (layout, cell[:-1])


def test_table1_rows_per_precision_and_fp32_reference():
    table = T.table1(_runs())
    assert table.header[0] == 'Precision'
    assert [r[0] for r in table.rows] == ['mixed16', 'fp8_e4m3']
    fp32 = [c[-1] for c in table.cells if c[3] == 'FP32']
    assert [s.n for s in fp32] == [1, 1]       # the reference in each row


def test_one_precision_keeps_the_paper_layout():
    runs = [r for r in _runs() if r['precision'] in ('mixed16', 'float32')
            and parse_mode(r['mode']).name in ('fp32', 'none', 'fixed',
                                               'adaptive')
            and not parse_mode(r['mode']).options]
    table = T.table1(runs)
    assert table.header == ['Dataset', 'Depth', 'FP32', 'None',
                            'Fixed (best)', 'Fixed (worst)', 'Adaptive']
    assert 'Not in this table' not in table.footer


def test_precision_table_lists_what_it_leaves_out():
    table = T.precision_table(_runs())
    assert 'Not in this table: 1 run (fp32-run)' in table.footer
