"""The same MNIST models and training in torch, from the same initial weights on the same
batches: the reference of `mnist-regress`.

    net = torch_model("mnist-cnn", model.weights())
    history = train_torch(net, images, labels, config, batch_orders(len(images), config))

The torch models read ggml's layout (mnist_target.models): Linear weights (out, in); conv
kernels OIHW with biases (C, 1, 1) flattened to (C,); the CNN flattens NCHW -> NHWC before
its dense layer, as ggml does. Training mirrors engine.train.Trainer: per physical batch the
mean cross-entropy scaled by 1/k (k physical batches per logical one), gradients summed over
the k, then one AdamW step (lr, betas (0.9, 0.999), eps 1e-8, no decay); the batches after
the split validate without training.
"""

from __future__ import annotations

import math
import time

import numpy as np

from engine.train import EpochResult
from mnist_target.models import HW, arch_name
from mnist_target.run import EpochRecord, TrainConfig


def _torch():
    """torch, running as many CPU threads as the engine (a fair time per epoch)."""
    try:
        import torch
    except ImportError:
        raise ImportError("the torch reference needs torch: pip install 'gradverify[torch]'") \
            from None
    from engine.backends.cpu.threads import get_num_threads
    if torch.get_num_threads() != get_num_threads():
        torch.set_num_threads(get_num_threads())
    return torch


def torch_model(arch: str, weights: dict[str, np.ndarray]):
    """A torch.nn.Module with `weights` (ggml's names and shapes) copied in."""
    torch = _torch()
    nn = torch.nn
    arch = arch_name(arch)

    def tensor(name):
        return torch.from_numpy(np.array(weights[name], np.float32))

    if arch == "mnist-fc":
        net = nn.Sequential(nn.Linear(784, 500), nn.ReLU(), nn.Linear(500, 10))
        pairs = [(net[0], "fc1"), (net[2], "fc2")]
        with torch.no_grad():
            for layer, name in pairs:
                layer.weight.copy_(tensor(f"{name}.weight"))
                layer.bias.copy_(tensor(f"{name}.bias"))
        return net

    class NHWCFlatten(nn.Module):
        def forward(self, x):
            return x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)

    net = nn.Sequential(nn.Unflatten(1, (1, HW, HW)),
                        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        NHWCFlatten(), nn.Linear(784, 10))
    with torch.no_grad():
        for layer, name in ((net[1], "conv1"), (net[4], "conv2")):
            layer.weight.copy_(tensor(f"{name}.kernel"))
            layer.bias.copy_(tensor(f"{name}.bias").reshape(-1))
        net[8].weight.copy_(tensor("dense.weight"))
        net[8].bias.copy_(tensor("dense.bias"))
    return net


def train_torch(net, images: np.ndarray, labels: np.ndarray, config: TrainConfig,
                orders: list[np.ndarray], on_epoch=None) -> list[EpochRecord]:
    """Train `net` (from torch_model) on `images` (n, 784) and int `labels` in the given
    per-epoch orders; returns one EpochRecord per epoch (losses per physical batch, as the
    engine's)."""
    torch = _torch()
    F = torch.nn.functional
    x_all = torch.from_numpy(np.ascontiguousarray(images, np.float32))
    y_all = torch.from_numpy(np.asarray(labels).astype(np.int64))
    opt = torch.optim.AdamW(net.parameters(), lr=config.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    b, k = config.batch_physical, config.batch_logical // config.batch_physical
    n = len(images)
    split = config.training_split(n)
    history = []
    for epoch, order in enumerate(orders, start=1):
        start = time.perf_counter()
        train, val = EpochResult("cross_entropy"), EpochResult("cross_entropy")
        order_t = torch.from_numpy(order.astype(np.int64))
        for i in range(n // b):
            idx = order_t[i * b:(i + 1) * b]
            x, y = x_all[idx], y_all[idx]
            training = (i + 1) * b <= split
            result = train if training else val
            if training:
                if i % k == 0:
                    opt.zero_grad(set_to_none=False)
                logits = net(x)
                loss = F.cross_entropy(logits, y)
                (loss / k if k > 1 else loss).backward()
                if i % k == k - 1:
                    opt.step()
            else:
                with torch.no_grad():
                    logits = net(x)
                    loss = F.cross_entropy(logits, y)
            result.losses.append(float(loss.detach()))
            result.ndata += b
            result.ncorrect = (result.ncorrect or 0) + int((logits.argmax(1) == y).sum())
        history.append(EpochRecord.from_results(epoch, train, val, time.perf_counter() - start))
        if on_epoch is not None:
            on_epoch(history[-1])
    return history


def evaluate_torch(net, images: np.ndarray, labels: np.ndarray,
                   batch: int = 1000) -> tuple[float, float]:
    """(accuracy, its standard error) of `net` on a labelled set."""
    torch = _torch()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(images), batch):
            x = torch.from_numpy(np.ascontiguousarray(images[start:start + batch], np.float32))
            y = np.asarray(labels[start:start + batch])
            correct += int((net(x).argmax(1).numpy() == y).sum())
    n = len(images)
    acc = correct / n
    return acc, (math.sqrt(acc * (1 - acc) / (n - 1)) if n > 1 else math.nan)
