"""A model's input shape is read off its first layer where that is certain; else one line names --shape."""

from __future__ import annotations

import pytest
from torch import nn

from dtwork import commands as measure
from dtwork.errors import DtworkError

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
