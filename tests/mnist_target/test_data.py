"""MNIST as training data: one-hot labels and datasets of the first N images."""

from __future__ import annotations

import numpy as np
import pytest

from engine.train import Dataset
from mnist_target.data import MnistDataError, one_hot, to_dataset
from mnist_target.pixels import pixels_to_float
from tests.mnist_target.data_files import sample_pixels


def test_one_hot():
    encoded = one_hot(np.array([3, 0, 9], np.int32))
    assert encoded.dtype == np.float32 and encoded.shape == (3, 10)
    assert np.array_equal(encoded.argmax(axis=1), [3, 0, 9]) and encoded.sum() == 3
    assert one_hot(np.array([[1]]), nclasses=2).tolist() == [[[0.0, 1.0]]]
    for labels, nclasses, message in [([0, 10], 10, r"label 10 at index 1 is outside 0\.\.9"),
                                      ([-1], 10, r"label -1 at index 0"),
                                      ([0.5], 10, r"labels must be integers, got dtype float64"),
                                      ([0], 0, r"nclasses must be an int >= 1, got 0")]:
        with pytest.raises(MnistDataError, match=message):
            one_hot(np.array(labels), nclasses)


def test_to_dataset_limit():
    images, labels = pixels_to_float(sample_pixels(20)[0]), sample_pixels(20)[1]
    dataset = to_dataset(images, labels, limit=7)
    assert isinstance(dataset, Dataset) and len(dataset) == 7
    assert dataset.labels.shape == (7, 10) and np.array_equal(dataset.data, images[:7])
    assert len(to_dataset(images, labels)) == 20
    for limit, message in [(0, r"limit must be an int >= 1, got 0"), (2.5, r"got 2\.5"),
                           (True, r"got True"), (21, r"limit 21 exceeds the 20 images")]:
        with pytest.raises(MnistDataError, match=message):
            to_dataset(images, labels, limit=limit)
