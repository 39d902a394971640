"""SSD data augmentation (Liu et al. 2016, §2.2 "Data augmentation"), as in
ChainerCV's ``examples/ssd/train.py``, from ChainerCV's own functions:

1. photometric distortion (``random_distort``: brightness, contrast,
   saturation, hue; OpenCV, a dependency of this project),
2. zoom out (``random_expand``, half of the time, filled with the mean),
3. random crop with IoU constraints (``random_crop_with_bbox_constraints``;
   boxes whose centre leaves the crop are dropped),
4. resize to the network size with a random interpolation
   (``resize_with_random_interpolation``),
5. random horizontal flip,

then mean subtraction and ``coder.encode`` into per-default-box targets.
"""
import copy

import numpy
from chainercv import transforms
from chainercv.links.model.ssd import random_crop_with_bbox_constraints
from chainercv.links.model.ssd import random_distort
from chainercv.links.model.ssd import resize_with_random_interpolation


class SSDTrainTransform(object):
    """``(img, bbox, label)`` -> ``(img, mb_loc, mb_label)``.

    Args:
        coder: the model's ``MultiboxCoder`` (copied, moved to the CPU).
        size (int): the model's input size (``model.insize``).
        mean: the model's mean (``model.mean``).
        photometric (bool): ChainerCV's photometric distortion (the
            recipe: ``True``).
    """

    def __init__(self, coder, size, mean, photometric=True):
        self.coder = copy.copy(coder)
        self.coder.to_cpu()
        self.size = int(size)
        self.mean = mean
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
        img = resize_with_random_interpolation(img, (self.size, self.size))
        bbox = transforms.resize_bbox(bbox, (H, W), (self.size, self.size))
        img, param = transforms.random_flip(img, x_random=True,
                                            return_param=True)
        bbox = transforms.flip_bbox(bbox, (self.size, self.size),
                                    x_flip=param['x_flip'])
        img = (img - self.mean).astype(numpy.float32)
        mb_loc, mb_label = self.coder.encode(bbox, label)
        return img, mb_loc, mb_label
