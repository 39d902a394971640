"""A run folder's TensorBoard events read back with TensorBoard's own
readers (not the writer's code), for the tests."""
import glob
import os

from google.protobuf import json_format

from tensorboard.backend.event_processing import event_accumulator as EA
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.plugins.hparams import plugin_data_pb2

#: what differs between two runs of the same numbers
TIME_TAGS = ('elapsed_time',)


def files(folder):
    return sorted(glob.glob(os.path.join(folder, 'events.out.tfevents.*')))


def accumulator(folder):
    """TensorBoard's EventAccumulator over ``folder``, nothing sampled away
    and nothing purged by it (what the files hold)."""
    acc = EA.EventAccumulator(
        folder, size_guidance={k: 0 for k in (
            EA.SCALARS, EA.HISTOGRAMS, EA.TENSORS, EA.COMPRESSED_HISTOGRAMS,
            EA.IMAGES, EA.AUDIO)}, purge_orphaned_data=False)
    acc.Reload()
    return acc


def scalars(folder):
    """{tag: [(step, value), ...]} of every scalar tag."""
    acc = accumulator(folder)
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
            for tag in acc.Tags()['scalars']}


def hparams_data(value):
    return plugin_data_pb2.HParamsPluginData.FromString(
        value.metadata.plugin_data.content)


def timeline(folder):
    """Every summary value of the run's event files, in file order, as
    ``(step, tag, what)``: a scalar's value, a histogram's (limits,
    counts), an HParams summary's content as JSON (a session end: its
    status); the wall-clock tags (:data:`TIME_TAGS`) left out."""
    out = []
    for path in files(folder):
        for event in event_file_loader.LegacyEventFileLoader(path).Load():
            for v in event.summary.value:
                if v.tag in TIME_TAGS:
                    continue
                kind = v.WhichOneof('value')
                if kind == 'simple_value':
                    what = v.simple_value
                elif kind == 'histo':
                    what = (tuple(v.histo.bucket_limit),
                            tuple(v.histo.bucket))
                else:
                    data = hparams_data(v)
                    what = data.session_end_info.status if \
                        data.HasField('session_end_info') else \
                        json_format.MessageToJson(data, sort_keys=True)
                out.append((event.step, v.tag, what))
    return out


def steps_by_tag(timeline_):
    steps = {}
    for step, tag, _ in timeline_:
        steps.setdefault(tag, []).append(step)
    return steps
