"""A stopped search rebuilt from its record (issue 48: "the search can be resumed where it stopped"), on
real SQLite stores: a search is recorded as the runner records it (a run per piece of work, its
"search" event, the trial's row), stopped part-way, then its searcher rebuilt by ``restore``; going on
with it must hand out exactly the work an uninterrupted search does after that point."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dtwork.commands.search_resume import restore
from dtwork.config.search import load_search
from dtwork.config.searchers import Searcher, Work, searcher_for
from dtwork.errors import DtworkError
from dtwork.store import searches
from dtwork.store.runs import RunStore

GRID = """name: sweep
hyperparameters:
  lr: {type: categorical, vals: [0.4, 0.1, 0.3, 0.2]}
searcher: {name: grid, metric: val_loss, smaller_is_better: true, max_length: {batches: 3}}
"""
ASHA = """name: asha
hyperparameters:
  lr: {type: double, minval: 0.0, maxval: 1.0}
searcher:
  name: adaptive_asha
  metric: val_loss
  smaller_is_better: true
  time_metric: batches
  max_time: 16
  max_trials: 9
  max_concurrent_trials: 1
  divisor: 2
  mode: aggressive
  max_rungs: 3
"""
FAILS = {3}  # the trials that fail (after logging the best metric of all)
CODE = "ctx.log(val_loss=abs(ctx.hparams['lr'] - 0.3))"


def _loss(hp: dict[str, Any], work: Work) -> float:
    """A trial's metric: better near lr 0.3, and the longer it trains."""
    length = 3 if work.length is None else work.length.value
    return abs(hp["lr"] - 0.3) + 1.0 / length


class Recorder:
    """Records a search as ``commands/search.py`` does, one piece after another, in a real store."""

    def __init__(self, store: RunStore, text: str) -> None:
        self.store, self.plan = store, load_search(text)
        new = searches.NewSearch(
            "s.yaml", self.plan.searcher, "val_loss", True, text, CODE, "c1", 2, "gloo", self.plan.hparams
        )
        self.sid = searches.create(store.db, new)
        self.works: list[tuple[int, int | None, bool]] = []  # (trial, length, resume) as handed out

    def drive(self, searcher: Searcher, stop_at: int | None = None, checkpoint: bool = False) -> None:
        """Run every piece (the ``stop_at``-th, 0-based, interrupted: then the search stops)."""
        count = 0
        while (work := searcher.next()) is not None:
            self.works.append((work.trial, None if work.length is None else work.length.value, work.resume))
            run = self.store.create_run(world_size=2, backend="gloo", cluster_id="c1")
            hp = self.plan.hparams[work.trial - 1]
            if count == stop_at:
                if checkpoint:  # the interrupt's consistent stop wrote one
                    self.store.add_event(run, "checkpoint", "checkpoint step-2", {})
                self.store.add_event(run, "search", "piece", {"search_id": self.sid, "trial": work.trial})
                self.store.set_run_status(run, "interrupted", ended=True)
                searches.set_trial(self.store.db, self.sid, work.trial, run_id=run, status="interrupted")
                searches.finish(self.store.db, self.sid, "interrupted")
                return
            metric = _loss(hp, work) / (10 if work.trial in FAILS else 1)  # logged before it failed
            self.store.add_metrics(run, [{"step": 2, "name": "val_loss", "value": metric}])
            ok = work.trial not in FAILS
            self.store.set_run_status(run, "completed" if ok else "failed", ended=True)
            self.store.add_event(run, "search", "piece", {"search_id": self.sid, "trial": work.trial})
            searcher.report(work, metric, ok=ok)
            status = "failed" if not ok else "stopped" if searcher.stopped(work.trial) else "completed"
            searches.set_trial(self.store.db, self.sid, work.trial, run_id=run, status=status, metric=metric)
            count += 1
        searches.finish(self.store.db, self.sid, "completed")

    def statuses(self) -> list[tuple[str, float | None]]:
        return [(t["status"], t["metric"]) for t in searches.trials(self.store.db, self.sid)]


def _store(tmp_path: Path, name: str) -> RunStore:
    return RunStore(tmp_path / name / "runs.sqlite")


@pytest.mark.parametrize(
    ("text", "stop_at"),
    [(GRID, 0), (GRID, 2), (GRID, 3), (ASHA, 0), (ASHA, 2), (ASHA, 5), (ASHA, 9)],
    ids=["grid-0", "grid-2", "grid-3", "asha-0", "asha-2", "asha-5", "asha-9"],
)
def test_a_resumed_search_hands_out_what_an_uninterrupted_one_does(
    tmp_path: Path, text: str, stop_at: int
) -> None:
    whole = Recorder(_store(tmp_path, "whole"), text)
    whole.drive(searcher_for(whole.plan))
    assert stop_at < len(whole.works)
    part = Recorder(_store(tmp_path, "part"), text)
    part.drive(searcher_for(part.plan), stop_at=stop_at)
    kept = {
        t["number"]: t["run_id"] for t in searches.trials(part.store.db, part.sid) if t["status"] != "not run"
    }
    back = restore(part.store, part.sid, None, None)
    assert back.code == CODE and back.plan.label == "s.yaml"
    ended = [t for t in back.trials if t["status"] in ("completed", "stopped", "failed")]
    assert all(t["run_id"] == kept[t["number"]] and t["runs"][-1] == t["run_id"] for t in ended)
    before = len(part.works)  # the interrupted piece runs again, first
    part.drive(back.searcher)
    assert part.works[before:] == whole.works[stop_at:]
    assert part.statuses() == whole.statuses()


def test_an_interrupted_asha_piece_goes_on_from_its_checkpoint_or_from_its_previous_rung(
    tmp_path: Path,
) -> None:
    plan_works = Recorder(_store(tmp_path, "whole"), ASHA)
    plan_works.drive(searcher_for(plan_works.plan))
    promoted = next(i for i, w in enumerate(plan_works.works) if w[2])  # the first promotion
    for checkpoint in (False, True):
        rec = Recorder(_store(tmp_path, f"cut{checkpoint}"), ASHA)
        rec.drive(searcher_for(rec.plan), stop_at=promoted, checkpoint=checkpoint)
        back = restore(rec.store, rec.sid, None, None)
        work = back.searcher.next()
        assert work is not None and work.resume
        trial = back.trials[work.trial - 1]
        cut = searches.trials(rec.store.db, rec.sid)[work.trial - 1]["run_id"]
        # its checkpoint when the interrupted run wrote one, else its rung-0 run's (as the promotion did)
        assert trial["run_id"] == (cut if checkpoint else trial["runs"][-1]) and trial["runs"][-1] != cut
    rec = Recorder(_store(tmp_path, "first"), ASHA)
    rec.drive(searcher_for(rec.plan), stop_at=0, checkpoint=True)
    work = restore(rec.store, rec.sid, None, None).searcher.next()
    assert work is not None and (work.trial, work.resume) == (1, True)  # rung 0 too, from its checkpoint


def test_resume_says_in_one_line_what_is_wrong(tmp_path: Path) -> None:
    done = Recorder(_store(tmp_path, "done"), GRID)
    done.drive(searcher_for(done.plan))
    with pytest.raises(DtworkError, match=rf"search {done.sid} \(s.yaml\) completed already"):
        restore(done.store, done.sid, None, None)
    with pytest.raises(DtworkError, match="no search 9"):
        restore(done.store, 9, None, None)
    rec = Recorder(_store(tmp_path, "cut"), GRID)
    rec.drive(searcher_for(rec.plan), stop_at=1)
    with pytest.raises(DtworkError, match="the search file differs from search 1's"):
        restore(rec.store, rec.sid, GRID.replace("0.4", "0.5"), None)
    with pytest.raises(DtworkError, match="the cell differs from search 1's code"):
        restore(rec.store, rec.sid, None, "ctx.log(val_loss=1.0)")
    path = tmp_path / "s.yaml"
    path.write_text(GRID + "\n# the same search, a comment added\n")
    back = restore(rec.store, rec.sid, path, "\n" + CODE + "\n")  # the same file and cell: fine
    assert back.code == CODE and [t["status"] for t in back.trials][:2] == ["completed", "interrupted"]
    assert restore(rec.store, rec.sid, None, "  \n").code == CODE  # an empty cell: the stored code
    searches.reopen(rec.store.db, rec.sid, "c2", 2, "gloo")
    with pytest.raises(DtworkError, match="still running on cluster c2"):
        restore(rec.store, rec.sid, None, None, live={"c2"})
    assert restore(rec.store, rec.sid, None, None, live={"c3"}).search_id == rec.sid  # its kernel died


def test_a_trial_that_failed_before_its_run_began_is_not_run_again(tmp_path: Path) -> None:
    rec = Recorder(_store(tmp_path, "s"), GRID)
    searcher = searcher_for(rec.plan)
    first = searcher.next()
    assert first is not None
    searcher.report(first, None, ok=False)  # its config failed: no run, no event
    searches.set_trial(rec.store.db, rec.sid, 1, run_id=None, status="failed", error="bad config")
    rec.drive(searcher, stop_at=1)
    back = restore(rec.store, rec.sid, None, None)
    rest = []
    while (work := back.searcher.next()) is not None:
        rest.append(work.trial)
        back.searcher.report(work, 1.0, ok=True)
    assert rest == [3, 4] and back.trials[0]["status"] == "failed"


def test_the_line_magic_only_resumes_and_a_new_search_needs_its_file() -> None:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.extension_manager.load_extension("dtwork")  # silent when already loaded
    with pytest.raises(DtworkError, match=r"^a search is a cell: %%dtrain search EXP.yaml"):
        shell.run_line_magic("dtrain", "search exp.yaml")
    with pytest.raises(DtworkError, match=r"^a search is a cell"):
        shell.run_cell_magic("dtrain", "search", "ctx.log(val_loss=1.0)")
    with pytest.raises(DtworkError, match="--resume: expected one argument"):
        shell.run_line_magic("dtrain", "search --resume")
