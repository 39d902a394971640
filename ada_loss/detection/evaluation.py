"""VOC evaluation of an SSD (paper §4.3: mAP on VOC2007 test).

ChainerCV's :class:`DetectionVOCEvaluator` calls ``model.predict``, which
runs the forward with ``train=False`` and no backprop graph; a model from
:func:`ada_loss.detection.build_ssd` computes it in its own dtype (FP16 GEMMs
in mixed16) and decodes boxes from FP32 outputs. The ``'evaluate'`` preset
(score threshold 0.01, NMS 0.45) and the VOC2007 11-point metric are those of
ChainerCV's SSD example and of the SSD paper's VOC2007 results.
"""
import chainer
from chainercv.extensions import DetectionVOCEvaluator

from ada_loss.datasets.voc import VOC_LABEL_NAMES


def make_voc_evaluator(dataset, model, batch_size=8,
                       label_names=VOC_LABEL_NAMES, use_07_metric=True,
                       iterator=None, comm=None):
    """A ``DetectionVOCEvaluator`` (trainer extension) over ``dataset``
    (``(img, bbox, label[, difficult])`` examples), or over ``iterator``
    when given (one that resumes exactly); sets the model's ``'evaluate'``
    preset. With a ChainerMN ``comm`` the evaluation is split over the
    ranks (ChainerCV's evaluator gathers the predictions)."""
    model.use_preset('evaluate')
    if iterator is None:
        iterator = chainer.iterators.SerialIterator(
            dataset, batch_size, repeat=False, shuffle=False)
    return DetectionVOCEvaluator(iterator, model, use_07_metric=use_07_metric,
                                 label_names=label_names, comm=comm)


def evaluate_detection(model, dataset, batch_size=8,
                       label_names=VOC_LABEL_NAMES, use_07_metric=True):
    """Runs the evaluator once, outside a trainer.

    Returns:
        dict: ``{'map': float, 'ap/<class>': float, ...}`` (NaN for classes
        absent from ``dataset``).
    """
    evaluator = make_voc_evaluator(dataset, model, batch_size, label_names,
                                   use_07_metric)
    result = evaluator()
    # Keys read 'main/map' (or '<name>/main/map' inside a trainer).
    return {k.split('main/', 1)[-1]: float(v) for k, v in result.items()}
