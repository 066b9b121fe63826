"""An instrument's calendar, read off its bar times: session days, periods, annualisation.

    cal = Calendar.of(ts)          # from every bar close time of an fxcache
    cal.session_day(ts)            # (N,) int64 trading-day number (not the UTC day)
    cal.period(ts)                 # (N,) int64 hour number: the unit statistics are pooled at
    cal.periods_per_year           # e.g. ~6,260 hours for a 24x5 market, ~8,770 for 24x7

Why read it off the data: fxcache files come from many venues (FX 24x5, CME futures
with a daily break, crypto 24x7, synthetic), and the statistics must not assume one.

- Session days: a trading day starts at the hour of day at which trading resumes
  after the weekly close (the most common hour of the first bar after a gap of more
  than a day: 22:00 UTC for FX and the synthetic market, 23:00 UTC for CME Globex).
  UTC days would cut a Sunday-evening stub off every FX week (26 % of the EURUSD
  test "days" were such stubs). A market with no gap of a day (24x7) keeps UTC days.
  Bar times are close times: a bar closing exactly at a boundary (22:00, or 10:00
  for the hour 09-10) belongs to the day or hour it ends, so times are taken 1 ns early.
- Periods: whole UTC hours of the bar's close time (the decision time of the bar's
  position; its return is earned until the next close). Windows of a few days hold
  too few days for a Sharpe ratio (5 daily returns: standard error ~7); they hold
  ~100 hours.
- Annualisation: periods per year = the hours of the week that hold a bar (each weighted
  by the share of the weeks it did), times the weeks of a year. A 7-day market is
  not 252 days.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

HOUR_NS = 3600 * 10**9
DAY_NS = 24 * HOUR_NS
WEEK_NS = 7 * DAY_NS
HOURS_PER_YEAR = 365.25 * 24


@dataclass(frozen=True)
class Calendar:
    session_offset_ns: int  # a session day starts at this time of day (UTC, whole hours)
    period_ns: int  # the pooling period: an hour (bars longer than that fill one hour each)
    periods_per_year: float

    @classmethod
    def of(cls, ts: np.ndarray) -> Calendar:
        ts = np.asarray(ts, dtype=np.int64)
        return cls(session_offset(ts), HOUR_NS, periods_per_year(ts, HOUR_NS))

    def session_day(self, ts) -> np.ndarray:
        return (np.asarray(ts, dtype=np.int64) - 1 - self.session_offset_ns) // DAY_NS

    def period(self, ts) -> np.ndarray:
        return (np.asarray(ts, dtype=np.int64) - 1) // self.period_ns

    def as_dict(self) -> dict:
        return {
            "session_offset_h": self.session_offset_ns / HOUR_NS,
            "period_h": self.period_ns / HOUR_NS,
            "periods_per_year": self.periods_per_year,
        }


def session_offset(ts: np.ndarray) -> int:
    """Time of day (ns, a whole hour) at which trading resumes after gaps of more than a day;
    0 (UTC midnight) when there is no such gap."""
    after_gap = ts[1:][np.diff(ts) > DAY_NS]
    if len(after_gap) == 0:
        return 0
    hours = ((after_gap % DAY_NS) // HOUR_NS).astype(np.int64)
    return int(np.bincount(hours, minlength=24).argmax()) * HOUR_NS


def periods_per_year(ts: np.ndarray, period_ns: int = HOUR_NS) -> float:
    """Periods holding a bar per year, from the weekly pattern of `ts`: for each hour of the
    week, the share of the weeks the data spans in which that hour held a bar, summed over
    the week's hours, times the weeks of a year (exact at the edges of the span: a partial
    first or last week counts only the hours it covers)."""
    weeks_per_year = HOURS_PER_YEAR / (7 * 24)
    if len(ts) < 2:
        return HOURS_PER_YEAR * HOUR_NS / period_ns
    active = np.unique((np.asarray(ts, dtype=np.int64) - 1) // period_ns)
    per_week = WEEK_NS // period_ns
    span = np.arange(active[0], active[-1] + 1)
    covered = np.bincount(span % per_week, minlength=per_week)
    held = np.bincount(active % per_week, minlength=per_week)
    return float(np.sum(held[covered > 0] / covered[covered > 0]) * weeks_per_year)
