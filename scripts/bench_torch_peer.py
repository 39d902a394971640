#!/usr/bin/env python
"""The field's reference on the same GPU: PyTorch's training step for the
networks ``scripts/bench_gpu.py`` times in Chainer (issue 35, items 4 and 6).

* ResNet-50 (torchvision), batch 64, 224×224, 1000 classes: float32 and
  mixed precision as PyTorch users train it (``torch.autocast`` to float16 +
  ``torch.amp.GradScaler``), channels-last, ``cudnn.benchmark`` on;
* CIFAR ResNet-20 and ResNet-110 of He et al. §4.2 (option-A shortcuts, the
  same network as ``ada_loss.models.cifar_resnet``), batch 128, 32×32, in the
  same two precisions.

Each step is forward, cross-entropy, backward, SGD with momentum 0.9; the
batch is fixed random data already on the GPU (no input pipeline in either
framework's figure). Medians of synchronized steps after warm-up. TF32 is
left at PyTorch's defaults (convolutions may use it, matrix products not):
the float32 figure is PyTorch's out-of-the-box one, stated as such.

    python scripts/bench_torch_peer.py [--repeats 30] [--json PATH]

Runs on the GPU machine's own Python (PyTorch 2.11, cuDNN); it imports
nothing from ada_loss (an independent peer).
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    """Two 3×3 convolutions; option-A shortcut (stride-2 subsampling and
    zero channels) where the shape changes, as He et al. on CIFAR."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.stride, self.pad = stride, cout - cin

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        if self.stride != 1 or self.pad:
            x = x[:, :, ::self.stride, ::self.stride]
            x = F.pad(x, (0, 0, 0, 0, 0, self.pad))
        return F.relu(h + x)


class CifarResNet(nn.Module):
    def __init__(self, depth, num_classes=10):
        super().__init__()
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        blocks, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(n):
                blocks.append(BasicBlock(cin, cout, stride if i == 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        h = self.blocks(F.relu(self.bn1(self.conv1(x))))
        return self.fc(h.mean((2, 3)))


def build(name):
    if name == 'resnet50':
        import torchvision
        return torchvision.models.resnet50(num_classes=1000), 64, 224, 1000
    return CifarResNet(int(name[len('resnet'):])), 128, 32, 10


def step_seconds(name, amp, repeats, warmup=10):
    torch.manual_seed(0)
    model, batch, size, classes = build(name)
    model = model.cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler('cuda', enabled=amp)
    x = torch.randn(batch, 3, size, size, device='cuda').to(
        memory_format=torch.channels_last)
    t = torch.randint(0, classes, (batch,), device='cuda')

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast('cuda', dtype=torch.float16, enabled=amp):
            loss = F.cross_entropy(model(x), t)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), batch


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--repeats', type=int, default=30)
    p.add_argument('--models', default='resnet50,resnet20,resnet110')
    p.add_argument('--json')
    args = p.parse_args()
    torch.backends.cudnn.benchmark = True
    info = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                cudnn=torch.backends.cudnn.version(),
                cudnn_benchmark=True,
                conv_tf32=torch.backends.cudnn.allow_tf32,
                matmul_tf32=torch.backends.cuda.matmul.allow_tf32)
    print(info, flush=True)
    rows = []
    for name in args.models.split(','):
        for amp in (False, True):
            sec, batch = step_seconds(name, amp, args.repeats)
            r = dict(model=name, batch=batch,
                     precision='amp_fp16' if amp else 'float32',
                     step_seconds=sec, images_per_second=batch / sec)
            rows.append(r)
            print('{model:9s} batch {batch:3d} {precision:8s} step '
                  '{step_seconds:.4f} s  {images_per_second:7.0f} images/s'
                  .format(**r), flush=True)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(machine=info, rows=rows), f, indent=1)


if __name__ == '__main__':
    main()
