"""SSD data augmentation (Liu et al. 2016, §2.2 "Data augmentation"), as in
ChainerCV's ``examples/ssd/train.py``, from ChainerCV's own functions:

1. photometric distortion (``random_distort``: brightness, contrast,
   saturation, hue; needs OpenCV's ``cv2``),
2. zoom out (``random_expand``, half of the time, filled with the mean),
3. random crop with IoU constraints (``random_crop_with_bbox_constraints``;
   boxes whose centre leaves the crop are dropped),
4. resize to the network size with a random interpolation
   (``resize_with_random_interpolation``, which needs ``cv2``; without it the
   same five interpolation families are drawn from PIL: bilinear, box
   (= cv2's area), nearest, bicubic, Lanczos),
5. random horizontal flip,

then mean subtraction and ``coder.encode`` into per-default-box targets.
"""
import copy
import warnings

import numpy
import PIL.Image
from chainercv import transforms
from chainercv.links.model.ssd import random_crop_with_bbox_constraints
from chainercv.links.model.ssd import random_distort
from chainercv.links.model.ssd import resize_with_random_interpolation


#: PIL counterparts of the interpolations ChainerCV's SSD resize draws from.
PIL_INTERPOLATIONS = (PIL.Image.BILINEAR, PIL.Image.BOX, PIL.Image.NEAREST,
                      PIL.Image.BICUBIC, PIL.Image.LANCZOS)


def random_interpolation_resize(img, size):
    """ChainerCV's ``resize_with_random_interpolation`` when ``cv2`` exists,
    else ``chainercv.transforms.resize`` with a random PIL interpolation."""
    if cv2_available():
        return resize_with_random_interpolation(img, size)
    inter = PIL_INTERPOLATIONS[numpy.random.randint(len(PIL_INTERPOLATIONS))]
    return transforms.resize(img.astype(numpy.float32), size,
                             interpolation=inter)


def cv2_available():
    try:
        import cv2  # NOQA
    except ImportError:
        return False
    return True


class SSDTrainTransform(object):
    """``(img, bbox, label)`` -> ``(img, mb_loc, mb_label)``.

    Args:
        coder: the model's ``MultiboxCoder`` (copied, moved to the CPU).
        size (int): the model's input size (``model.insize``).
        mean: the model's mean (``model.mean``).
        photometric: ``True`` (needs ``cv2``; the recipe), ``False``, or
            ``'auto'``: on when ``cv2`` is importable, else skipped with a
            warning (a deviation from the recipe).
    """

    def __init__(self, coder, size, mean, photometric='auto'):
        self.coder = copy.copy(coder)
        self.coder.to_cpu()
        self.size = int(size)
        self.mean = mean
        if photometric == 'auto':
            photometric = cv2_available()
            if not photometric:
                warnings.warn('SSDTrainTransform: OpenCV (cv2) is not '
                              'installed, photometric distortion is skipped '
                              '(pip install opencv-python-headless)')
        elif photometric and not cv2_available():
            raise ImportError('photometric distortion (ChainerCV '
                              'random_distort) needs OpenCV: pip install '
                              'opencv-python-headless, or set photometric '
                              'to false/auto')
        self.photometric = bool(photometric)

    def __call__(self, in_data):
        img, bbox, label = in_data[:3]
        if self.photometric:
            img = random_distort(img)
        if numpy.random.randint(2):
            img, param = transforms.random_expand(
                img, fill=self.mean, return_param=True)
            bbox = transforms.translate_bbox(
                bbox, y_offset=param['y_offset'], x_offset=param['x_offset'])
        img, param = random_crop_with_bbox_constraints(
            img, bbox, return_param=True)
        bbox, param = transforms.crop_bbox(
            bbox, y_slice=param['y_slice'], x_slice=param['x_slice'],
            allow_outside_center=False, return_param=True)
        label = label[param['index']]
        _, H, W = img.shape
        img = random_interpolation_resize(img, (self.size, self.size))
        bbox = transforms.resize_bbox(bbox, (H, W), (self.size, self.size))
        img, param = transforms.random_flip(img, x_random=True,
                                            return_param=True)
        bbox = transforms.flip_bbox(bbox, (self.size, self.size),
                                    x_flip=param['x_flip'])
        img = (img - self.mean).astype(numpy.float32)
        mb_loc, mb_label = self.coder.encode(bbox, label)
        return img, mb_loc, mb_label
