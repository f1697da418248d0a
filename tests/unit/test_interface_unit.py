"""``--interface IF``: the controller, the rendezvous store and the collectives listen on that
interface's address only; an unknown name fails before anything starts, naming the interfaces.

Its tests that need no engines; the others are in tests/cluster/test_interface.py.
"""

from __future__ import annotations

import time

import pytest

import dtwork
from dtwork.errors import DtworkError
from dtwork.launch.rendezvous import interface_address


def test_an_unknown_interface_fails_at_once_naming_the_interfaces() -> None:
    t0 = time.monotonic()
    with pytest.raises(DtworkError) as failed:
        dtwork.start(n=2, backend="gloo", interface="nosuch0")
    assert time.monotonic() - t0 < 10.0  # before any engine starts (that takes far longer)
    text = str(failed.value)
    assert "'nosuch0' not found on this host" in text and "lo (127.0.0.1)" in text, text
    assert "\n" not in text


def test_an_interface_without_ipv4_is_refused_with_the_usable_ones() -> None:
    with pytest.raises(DtworkError, match=r"'ib0' has no IPv4 address on this host; .*eth0 \(10\.0\.0\.2\)"):
        interface_address("ib0", {"ib0": [], "eth0": ["10.0.0.2"], "lo": ["127.0.0.1"]})
    assert interface_address("eth0", {"eth0": ["10.0.0.2", "10.0.0.3"]}) == "10.0.0.2"
