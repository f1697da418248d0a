"""Rank 0's rendezvous port: held from the moment it is chosen to the join (no other process can take it)."""

from __future__ import annotations

import errno
import socket
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist

from dtwork.runtime import entry


def _spec(port: int, rank: int) -> Any:
    return {"master_addr": "127.0.0.1", "master_port": port, "world_size": 1, "rank": rank}


def test_a_reserved_port_cannot_be_taken_before_the_join_and_the_store_serves_on_it() -> None:
    port = entry.reserve_port("127.0.0.1", 2)
    other = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own TCPStore servers do
    with pytest.raises(OSError) as taken, other:
        other.bind(("127.0.0.1", port))  # a second notebook's cluster, choosing the same port meanwhile
    assert taken.value.errno == errno.EADDRINUSE
    store = entry._rendezvous_store(_spec(port, 0), timedelta(seconds=30))
    client = dist.TCPStore("127.0.0.1", port, 1, False, timedelta(seconds=30))
    client.set("joined", "rank 1")
    assert store.get("joined") == b"rank 1"


def test_rank_0_refuses_a_port_it_did_not_reserve() -> None:
    entry.reserve_port("127.0.0.1", 2)
    with pytest.raises(RuntimeError, match="reserve_port"):
        entry._rendezvous_store(_spec(1, 0), timedelta(seconds=5))
