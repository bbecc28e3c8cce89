"""The MNIST console scripts (pyproject.toml), `mnist-train`, `mnist-eval` and
`mnist-regress`: mnist_target.cli's mains inside checkkit.console's launch, which loads the
command line only inside it (module doc there)."""

from checkkit.console import script  # the standard library only

mnist_train = script("mnist-train", "mnist_target.cli", "train_main")
mnist_eval = script("mnist-eval", "mnist_target.cli", "eval_main")
mnist_regress = script("mnist-regress", "mnist_target.cli", "regress_main")
