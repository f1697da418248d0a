"""The core: real engines, a real gloo process group, the magics on a real IPython shell.

Its tests that need no engines; the others are in tests/cluster/test_core.py.
"""

from __future__ import annotations

import time

import psutil
import pytest

from dtwork.errors import DtworkError
from dtwork.launch.rendezvous import assign_ranks, choose_interface, validate_request


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("start -n 0", "the number of ranks must be a whole number >= 1, got 0"),
        ("start --backend nccl", "--backend nccl needs GPUs, and NVML sees none on this machine"),
        ("start --backend mpi", "unknown backend 'mpi': use one of auto, nccl, gloo"),
        ("start --frobnicate", "unrecognized arguments: --frobnicate"),
        ("start -n 4 --global-batch-size 3", "global batch size 3 is smaller than the 4 slots"),
        ("start --timeout -1", "--timeout must be a positive number of seconds"),
        ("start -n two", "argument -n: invalid int value: 'two'"),
        ("launch", "unknown %dtrain subcommand 'launch'"),
        ("", "%dtrain needs a subcommand"),
    ],
)
def test_bad_start_input_fails_at_once_and_starts_nothing(line: str, message: str) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "dtwork")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    t0 = time.monotonic()
    with pytest.raises(DtworkError) as info:
        ip.run_line_magic("dtrain", line)
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    assert time.monotonic() - t0 < 5
    after = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not after, "a bad request started processes"


def test_more_ranks_than_gpus_is_refused_with_what_is_there() -> None:
    with pytest.raises(
        DtworkError, match=r"asked for 4 ranks but this machine has 2 GPUs .*use -n 2 or fewer"
    ):
        validate_request(4, "auto", 2, timeout=10, global_batch_size=None)
    assert validate_request(None, "auto", 2, timeout=10, global_batch_size=None) == (2, "nccl")
    assert validate_request(None, "auto", 0, timeout=10, global_batch_size=None) == (2, "gloo")


def _probe(host: str, pid: int, gpus: int = 0, addrs: dict | None = None) -> dict:
    return {
        "hostname": host,
        "pid": pid,
        "gpus": [{"index": i} for i in range(gpus)],
        "addresses": addrs or {"lo": ["127.0.0.1"], "eth0": [f"10.0.0.{pid % 250}"]},
    }


def test_multi_host_rank_assignment_and_interface_choice() -> None:
    probes = {0: _probe("b", 10, 2), 1: _probe("a", 11, 2), 2: _probe("b", 12, 2), 3: _probe("a", 13, 2)}
    plans = assign_ranks(probes, use_gpus=True)
    assert [(p.rank, p.hostname, p.local_rank, p.gpu) for p in plans] == [
        (0, "b", 0, 0),
        (1, "b", 1, 1),
        (2, "a", 0, 0),
        (3, "a", 1, 1),
    ]
    assert choose_interface(probes, None) == "eth0"
    kernel_first = assign_ranks(probes, use_gpus=True, first_host="a")
    assert [(p.rank, p.hostname, p.engine_id) for p in kernel_first][:2] == [(0, "a", 1), (1, "a", 3)]
    with pytest.raises(DtworkError, match="network interface 'ib0' not found on host"):
        choose_interface(probes, "ib0")
    probes[2]["addresses"] = {**probes[2]["addresses"], "ib0": []}  # there, but without IPv4 on b
    probes[3]["addresses"] = {**probes[3]["addresses"], "ib0": ["10.1.0.3"]}
    probes[1]["addresses"] = {**probes[1]["addresses"], "ib0": ["10.1.0.1"]}
    with pytest.raises(DtworkError, match=r"'ib0' not found on host\(s\) b, or it has no IPv4 address"):
        choose_interface(probes, "ib0")
    with pytest.raises(DtworkError, match="3 slots span 2 hosts with 2 GPUs each: use a multiple of 2"):
        assign_ranks({0: _probe("a", 1, 2), 1: _probe("a", 2, 2), 2: _probe("b", 3, 2)}, use_gpus=True)
    lonely = {
        0: _probe("a", 1, addrs={"lo": ["127.0.0.1"], "eth0": ["10.0.0.1"]}),
        1: _probe("b", 2, addrs={"lo": ["127.0.0.1"], "ib0": ["10.1.0.1"]}),
    }
    with pytest.raises(DtworkError, match="share no network interface"):
        choose_interface(lonely, None)
