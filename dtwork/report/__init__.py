"""Export a run as a notebook that someone else can read and re-run (+ standalone HTML).

``dtwork.report.export(run_id, path, ...)`` writes the report; :mod:`~dtwork.report.scrub` keeps
secrets out of it, :mod:`~dtwork.report.build` builds it from the run store,
:mod:`~dtwork.report.verify` re-executes it and compares the numbers, and
:mod:`~dtwork.report.helpers` is what the report's own cells import. ``export_search(search_id, path)``
(:mod:`~dtwork.report.search`) writes a search's report.
"""

from __future__ import annotations

from dtwork.report.scrub import Scrubber, secret_environ
from dtwork.report.search import SearchReport, export_search
from dtwork.report.verify import compare
from dtwork.report.write import Report, export

__all__ = ["Report", "Scrubber", "SearchReport", "compare", "export", "export_search", "secret_environ"]
