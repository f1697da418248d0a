"""A model's input shape is read off its first layer where that is certain; else one line names --shape.

Its tests that need no engines; the others are in tests/cluster/test_shape_hint.py.
"""

from __future__ import annotations

import pytest
from torch import nn

from dtwork.runtime.loop.data import input_shape, shape_hint
from tests.cluster.test_shape_hint import ConvNet


def test_a_first_linear_gives_the_shape() -> None:
    assert input_shape(nn.Sequential(nn.Flatten(), nn.Linear(20, 4), nn.Linear(4, 2))) == (20,)


@pytest.mark.parametrize(
    ("model", "hint"),
    [
        (
            ConvNet(),
            "could not infer the input shape of ConvNet (its first layer is Conv2d): pass --shape 3,H,W",
        ),
        (nn.Sequential(nn.Conv1d(5, 2, 3)), "(its first layer is Conv1d): pass --shape 5,L"),
        (nn.Sequential(nn.Conv3d(1, 2, 3)), "(its first layer is Conv3d): pass --shape 1,D,H,W"),
        (nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 2)), "(its first layer is Embedding): pass --shape"),
    ],
)
def test_a_first_layer_of_unknown_input_size_gives_a_hint(model: nn.Module, hint: str) -> None:
    assert input_shape(model) is None  # a later Linear's in_features is not the input's
    assert hint in shape_hint(model)


def test_a_refused_shape_names_it_and_the_fix() -> None:
    text = shape_hint(ConvNet(), (128,), "Expected 3D (unbatched) or 4D (batched) input to conv2d")
    assert text == (
        "ConvNet refused inputs of shape 128 (Expected 3D (unbatched) or 4D (batched) input to conv2d; "
        "its first layer is Conv2d): pass --shape 3,H,W"
    )
