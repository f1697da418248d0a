"""What ctx.wrap measures under strategy='fsdp', on 2 real gloo ranks: the gradient noise scale
(norms taken around the reduce-scatter) and the step-time split (all-gathers and reduce-scatters
counted as communication)."""

from __future__ import annotations

from typing import Any

import pytest

from dtwork.errors import RankFailure
from tests.test_fsdp import MODEL
from tests.test_gns import DATA, RESULT, STEPS_LOOP

STEPS = 300


def _gns(cluster: Any, strategy: str) -> tuple[float, list[dict[str, Any]]]:
    cluster.configure({"global_batch_size": 64, "seed": 7, "gns": {"enabled": True}})
    loop = STEPS_LOOP.replace("ctx.wrap(net)", f"ctx.wrap(net, strategy={strategy!r})")
    cluster.run(DATA.replace("SEED", "7") + loop.replace("STEPS", str(STEPS)) + RESULT, quiet=True)
    estimates, measured = cluster.pull("estimate"), cluster.pull("measured")
    assert len(set(estimates)) == 1 and measured == [STEPS, STEPS]  # every step, the same on both ranks
    store, rid = cluster.session.store, cluster.session.run_id
    return estimates[0], store.metrics(rid, "comm_time", rank="all")


def test_fsdp_gns_equals_ddp_gns_and_its_collectives_count_as_communication(fresh_run: Any) -> None:
    fsdp, fsdp_comm = _gns(fresh_run, "fsdp")
    ddp, _ = _gns(fresh_run, "ddp")
    assert fsdp == pytest.approx(ddp, rel=0.05), (fsdp, ddp)
    assert {r["rank"] for r in fsdp_comm} == {0, 1} and all(r["value"] > 0 for r in fsdp_comm)


def test_fsdp_gns_with_accumulation_is_refused_in_one_line(fresh_run: Any) -> None:
    fresh_run.configure({"optimizations": {"aggregation_frequency": 2}})
    with pytest.raises(
        RankFailure, match="not measured under strategy='fsdp' with aggregation_frequency > 1"
    ):
        fresh_run.run(MODEL + "ctx.wrap(net, strategy='fsdp', gns=True)", quiet=True)
