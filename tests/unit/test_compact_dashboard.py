"""The dashboard's figures fit one screen: the live rows and the finished cell's figure of the three
base figures stay under a 768 px window with the header above them (the browser test measures the
drawn dashboard; this pins the figures' own heights)."""

from __future__ import annotations

from dtwork import plots

SCREEN = 768
HEADER = 120  # the header line and two ranks' bars, with room to spare


def test_the_three_base_figures_fit_one_screen() -> None:
    series = [plots.MetricsSeries(), plots.ThroughputSeries(), plots.StepTimeSeries()]
    live = plots.stacked_figure(series)["layout"]["height"]
    finished = plots.dashboard_figure([(s, []) for s in series], "run 1 · finished").layout.height
    assert live + HEADER <= SCREEN
    assert finished + HEADER <= SCREEN
