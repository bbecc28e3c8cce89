"""How much MNIST test accuracy moves with the seed, for the regression run's recipe.

    python bench/mnist_seed_spread.py --arch cnn --seeds 0 1 2 3 4 5
    python bench/mnist_seed_spread.py --arch fc --seeds 0 1 2 --epochs 30

For each seed: the initial weights and per-epoch batch order that `mnist-regress --seed S`
uses (mnist_target.models.Model.new, mnist_target.run.batch_orders), trained in torch on the
CPU (mnist_target.torch_ref, AdamW lr 1e-3, logical batch 1000 from two physical batches of
500, 5% validation split) and evaluated on the 10,000 test images. `mnist-regress` shows
that the engine follows this torch run's loss curve (to 2% by its bar; about 2e-4 measured),
so the spread of torch's accuracy over seeds is where a fixed-seed accuracy bar sits. Torch
runs on one thread here (cores are left to whatever else runs; accuracy does not depend on
it). Prints one line per seed, then the mean, the standard deviation and how many seeds
reach the bar.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from mnist_target.regress import ACCURACY_BARS


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", choices=("fc", "cnn"), default="cnn")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    p.add_argument("--epochs", type=int, default=30)
    args = p.parse_args(argv)

    import torch

    from mnist_target.data import load_mnist
    from mnist_target.models import Model
    from mnist_target.run import TrainConfig, batch_orders
    from mnist_target.torch_ref import evaluate_torch, torch_model, train_torch

    torch.set_num_threads(1)
    data = load_mnist()
    bar = ACCURACY_BARS[f"mnist-{args.arch}"]
    accuracies = []
    for seed in args.seeds:
        start = time.perf_counter()
        config = TrainConfig(epochs=args.epochs, seed=seed)
        model = Model.new(args.arch, init="torch", seed=seed)
        net = torch_model(model.arch, model.weights())
        orders = batch_orders(len(data.train_images), config)
        train_torch(net, data.train_images, data.train_labels, config, orders)
        acc = evaluate_torch(net, data.test_images, data.test_labels)[0]
        accuracies.append(acc)
        print(f"{args.arch} seed {seed}: test accuracy {100 * acc:.2f}% "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
    mean = statistics.mean(accuracies)
    sd = statistics.stdev(accuracies) if len(accuracies) > 1 else float("nan")
    reached = sum(a >= bar for a in accuracies)
    print(f"{args.arch}: mean {100 * mean:.2f}%, standard deviation {100 * sd:.2f} points over "
          f"{len(accuracies)} seeds; {reached} of {len(accuracies)} reach the bar "
          f"{100 * bar:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
