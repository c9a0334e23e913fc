"""The console's p50/p95 (``store.histograms.quantile``): Prometheus's ``histogram_quantile`` over
the persisted cumulative buckets."""

from __future__ import annotations

import pytest

from store.histograms import HistogramValues, quantile


def test_a_quantile_is_interpolated_within_the_bucket_its_rank_falls_in() -> None:
    # Given ten observations: four in (0.05, 0.1], six in (0.1, 0.25]
    h = HistogramValues([("0.05", 0), ("0.1", 4), ("0.25", 10), ("+Inf", 10)], 10, 1.5)
    # Then the median (rank 5) and the 95th (rank 9.5) lie in (0.1, 0.25], linearly placed, and the
    # 20th (rank 2) in (0.05, 0.1]
    assert quantile(h, 0.5) == pytest.approx(0.1 + 0.15 * 1 / 6)
    assert quantile(h, 0.95) == pytest.approx(0.1 + 0.15 * 5.5 / 6)
    assert quantile(h, 0.2) == pytest.approx(0.05 + 0.05 * 2 / 4)


def test_a_quantile_past_the_last_bound_is_that_bound_and_none_without_observations() -> None:
    # Given one observation within 1 s and two past the last bound
    h = HistogramValues([("0.5", 0), ("1", 1), ("+Inf", 3)], 3, 9000.0)
    # Then the p95 is the highest finite bound (as histogram_quantile answers), the p10 within (0.5, 1]
    assert quantile(h, 0.95) == 1.0
    assert quantile(h, 0.1) == pytest.approx(0.5 + 0.5 * 0.3)
    # And a lane with no attempt has none
    assert quantile(HistogramValues([("1", 0), ("+Inf", 0)], 0, 0.0), 0.5) is None
