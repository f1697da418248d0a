"""A model's input shape is read off its first layer where that is certain; else one line names --shape."""

from __future__ import annotations

import pytest
from torch import nn

from dtwork import commands as measure
from dtwork.errors import DtworkError
from dtwork.runtime.loop.data import input_shape, shape_hint

CONVNET = """
import torch.nn as nn

class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.head = nn.Linear(128, 10)
    def forward(self, x):
        return self.head(self.conv(x).mean((2, 3)).repeat(1, 16))
"""


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.head = nn.Linear(128, 10)


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


def test_scaling_a_convnet_fails_in_one_line_naming_shape(fresh_run) -> None:
    fresh_run.run(CONVNET, quiet=True)
    with pytest.raises(DtworkError) as info:
        measure.scaling(fresh_run, "ConvNet()", slots=[1, 2], steps=1, warmup=0, quiet=True)
    assert str(info.value) == (
        "ConvNet(): could not infer the input shape of ConvNet (its first layer is Conv2d): pass --shape 3,H,W"
    )
    with pytest.raises(DtworkError) as info:
        measure.scaling(fresh_run, "ConvNet()", slots=[2], steps=1, warmup=0, shape="3,8", quiet=True)
    text = str(info.value)
    assert "ConvNet refused inputs of shape 3,8 (" in text and text.endswith("pass --shape 3,H,W")
    assert "\n" not in text and "_bench" not in text
    # the engines are still usable: a right shape measures
    assert measure.scaling(
        fresh_run, "ConvNet()", slots=[2], steps=1, warmup=0, shape="3,8,8", quiet=True
    ).points
