"""``jaderl/StockTrading-v0``: FinRL-style stock trading as a batched torch env, with a backtest against buy-and-hold.

Every sub-env is one replica of a market: a portfolio of cash and whole shares of ``n`` stocks, traded at each
period's closing price. The price table (dates x tickers) comes from a CSV file (:func:`read_prices`) or, by default,
from the monthly closes bundled with the ``vega_datasets`` package (:func:`load_bundled`). A split date divides it:
training episodes live on the dates before the split, the backtest (:func:`backtest`) runs once over the dates from
the split on.

Env id (everything training, checkpoints, evaluation and resume carry is this string)::

    jaderl/StockTrading-v0
    jaderl/StockTrading-v0?csv=/data/prices.csv&split=2019-01-01&cost=0.001&hmax=100

Options (:class:`StockOptions`), ``KEY=VALUE`` pairs joined by ``&`` after a ``?``: ``csv`` (path of a price CSV;
default: the bundled data), ``tickers`` (comma-separated subset), ``split`` (first backtest date, ``YYYY-MM-DD``),
``cost`` (proportional cost of every buy and sell), ``hmax`` (most shares of one stock traded in one step), ``cash``
(initial cash), ``episode`` (training episode length in steps), ``window`` (moving-average window in periods).

One step, per replica (all tensor code, no per-replica or per-stock Python loop):

1. the action ``a`` in ``[-1, 1]^n`` (clipped) becomes ``trunc(a * hmax)`` shares per stock, sold where negative and
   bought where positive, at today's close ``p``;
2. sells first, limited to the shares held; the cash rises by ``shares * p * (1 - cost)``;
3. buys next, limited by the cash: when ``sum(shares * p) * (1 + cost)`` exceeds it, every buy is scaled by the same
   factor and rounded down to whole shares, so the cash never goes negative;
4. the day advances; the reward is ``(V' - V) / V0``: the change of the portfolio value ``V = cash + sum(holdings *
   p)`` from before the trades to the next close, divided by the episode's initial value ``V0`` (an episode's return
   is then its cumulative return, e.g. ``0.12`` for +12 %).

Observation, ``(num_envs, 1 + 4 n)`` in the env's dtype: ``[cash / V, p / p_first (n), holdings * p / V (n),
z-scored one-period return (n), z-scored p / moving average - 1 (n)]``; ``p_first`` is each stock's first price in the
data, and both z-scores use the mean and standard deviation over the training dates only.

Episodes: a training replica starts on a random day of the training dates (uniform over the days that leave a full
episode before the split) with random initial cash ``cash * U(0.9, 1.1)`` and no shares, and is truncated after
``episode`` steps (default: half the usable training steps), then resets itself (``info["final_obs"]`` holds the
observation it reached, ``info["portfolio_value"]`` the value). The backtest env (``backtest=True``) has no randomness:
it starts on the first date on or after the split with exactly ``cash`` and runs to the last date.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import gzip
import importlib.util
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, unquote

import numpy as np
import torch

from jaderl.envs.vec import NONFINITE_ACTIONS, EnvError, VecEnv, as_action_tensor, seed_value, state_tensors

__all__ = [
    "BUNDLED_SPLIT",
    "BUNDLED_TICKERS",
    "STOCK_ENVS",
    "STOCK_ID",
    "BacktestReport",
    "Market",
    "Metrics",
    "Policy",
    "StockOptions",
    "StockTradingEnv",
    "backtest",
    "buy_and_hold_values",
    "is_stock_id",
    "load_bundled",
    "load_market",
    "parse_env_id",
    "periods_per_year",
    "portfolio_metrics",
    "read_prices",
]

STOCK_ID = "jaderl/StockTrading-v0"
BUNDLED_TICKERS = ("AAPL", "AMZN", "IBM", "MSFT")
"""Tickers of the bundled market by default (GOOG, also in the file, has prices only from August 2004 on)."""
BUNDLED_SPLIT = dt.date(2008, 1, 1)
"""Default split of the bundled market: train on 2000-01 to 2007-12, backtest on 2008-01 to 2010-03."""
DEFAULT_SPLIT_FRACTION = 0.8
"""Default split of a CSV market: the date 80 % of the way through its dates."""
INITIAL_CASH_JITTER = 0.1
"""Training replicas start with ``cash * U(1 - jitter, 1 + jitter)``."""

_TICKER_COLUMNS = ("ticker", "tic", "symbol")
_CLOSE_COLUMNS = ("close", "price")
_PRICE_FIELDS = ("open", "high", "low", "close", "adj close", "adjclose", "price", "volume")
"""Column names of one stock's price history, never tickers of the wide layout."""
_OPTION_HELP = "csv, tickers, split, cost, hmax, cash, episode, window"

StepResult = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]


# ------------------------------------------------------------------------------------------------------ the data
@dataclasses.dataclass(frozen=True)
class Market:
    """A table of closing prices: ``prices[t, i]`` is ticker ``tickers[i]``'s close on ``dates[t]`` (sorted)."""

    dates: tuple[dt.date, ...]
    tickers: tuple[str, ...]
    prices: np.ndarray
    """``(len(dates), len(tickers))`` float64, every entry positive and finite."""
    source: str
    """Where the prices came from (a path, or the bundled package's name)."""

    @property
    def periods_per_year(self) -> int:
        """252 for daily data (365 when a quarter of the dates or more fall on weekends: markets that trade every
        day, such as crypto), 52 weekly, 12 monthly, 4 quarterly, else 1: read from the median gap between dates."""
        return periods_per_year(self.dates)

    def split_index(self, split: dt.date) -> int:
        """Index of the first date on or after ``split`` (``len(dates)`` when there is none)."""
        return int(np.searchsorted(np.array([d.toordinal() for d in self.dates]), split.toordinal(), side="left"))


def periods_per_year(dates: Sequence[dt.date]) -> int:
    """Trading periods per year of a date series, from the median number of calendar days between its dates (see
    :attr:`Market.periods_per_year`)."""
    if len(dates) < 2:
        return 252
    gap = float(np.median(np.diff([d.toordinal() for d in dates])))
    if gap <= 5 and sum(d.weekday() >= 5 for d in dates) >= 0.25 * len(dates):  # 2 of 7 days: every day trades
        return 365
    for limit, periods in ((5, 252), (10, 52), (45, 12), (120, 4)):
        if gap <= limit:
            return periods
    return 1


def _parse_date(text: str, where: str) -> dt.date:
    try:
        return dt.datetime.fromisoformat(text.strip()).date()
    except ValueError:
        raise EnvError(f"{where}: cannot read the date {text!r}; write dates as YYYY-MM-DD") from None


def _parse_price(text: str, ticker: str, date: dt.date, where: str) -> float:
    try:
        price = float(text)
    except ValueError:
        price = math.nan
    if not (math.isfinite(price) and price > 0):
        raise EnvError(f"{where}: the price of {ticker} on {date} is {text.strip()!r}; every price must be a "
                       "positive number (leave the cell empty where there is none)")
    return price


def _market_from_records(records: dict[tuple[dt.date, str], float], file_tickers: Sequence[str],
                         tickers: Sequence[str] | None, source: str) -> Market:
    """The table of ``tickers`` (default: all) on the dates where every one of them has a price."""
    if tickers is None:
        tickers = list(dict.fromkeys(file_tickers))
    for ticker in tickers:
        if ticker not in file_tickers:
            raise EnvError(f"ticker {ticker!r} is not in {source} (it has {', '.join(dict.fromkeys(file_tickers))}); "
                           "fix tickers= in the env id")
    if len(set(tickers)) != len(tickers):
        raise EnvError(f"tickers= names a ticker twice ({', '.join(tickers)}); name each once")
    all_dates = sorted({date for date, _ in records})
    dates = [d for d in all_dates if all((d, t) in records for t in tickers)]
    if len(dates) < 3:
        raise EnvError(f"{source} has {len(dates)} dates on which all of {', '.join(tickers)} have a price; "
                       "a market needs at least 3 (check the file or pick other tickers=)")
    prices = np.array([[records[d, t] for t in tickers] for d in dates], dtype=np.float64)
    return Market(tuple(dates), tuple(tickers), prices, source)


def read_prices(path: str | Path, tickers: Sequence[str] | None = None) -> Market:
    """Read closing prices from a CSV file (gzip-compressed when its name ends in ``.gz``).

    Two layouts are accepted; the header names the columns (case-insensitive) and other columns are ignored:

    * long: one row per date and ticker, with columns ``date``, ``ticker`` (or ``tic`` or ``symbol``) and ``close``
      (or ``price``), e.g. ``2019-01-02,AAPL,39.48``;
    * wide: a ``date`` column and one column of closes per ticker, named by the ticker, e.g.
      ``date,AAPL,MSFT`` then ``2019-01-02,39.48,101.12``.

    Dates are ``YYYY-MM-DD`` (a time after them is ignored), in any order. Prices must be positive numbers; an empty
    cell (or a missing row) means no price, and only the dates on which every selected ticker has a price are kept.
    ``tickers`` selects and orders the tickers (default: all, in the order they first appear).

    Raises:
        EnvError: one sentence naming the problem and the fix (missing file or column, unreadable date or price,
            duplicate row, unknown ticker, too few dates).
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise EnvError(f"price file {str(path)!r} does not exist; give csv= the path of an existing CSV file "
                       "(an absolute path works from any directory)")
    opener = gzip.open if path.name.endswith(".gz") else open
    name = str(path)
    try:  # utf-8-sig: a spreadsheet's "CSV UTF-8" export starts with a byte-order mark
        with opener(path, "rt", newline="", encoding="utf-8-sig") as f:
            rows = list(csv.reader(f))
    except UnicodeDecodeError as exc:
        raise EnvError(f"{name} is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8 CSV") from None
    if not rows:
        raise EnvError(f"{name} is empty; it needs a header line such as date,ticker,close")
    header = [c.strip() for c in rows[0]]
    lower = [c.lower() for c in header]
    if "date" not in lower:
        raise EnvError(f"{name} has no 'date' column (header: {','.join(header)}); name the columns date,ticker,close "
                       "(long layout) or date,TICKER1,TICKER2,... (wide layout)")
    date_col = lower.index("date")
    ticker_col = next((lower.index(c) for c in _TICKER_COLUMNS if c in lower), None)
    records: dict[tuple[dt.date, str], float] = {}
    file_tickers: list[str] = []
    if ticker_col is not None:  # long layout
        close_col = next((lower.index(c) for c in _CLOSE_COLUMNS if c in lower), None)
        if close_col is None:
            raise EnvError(f"{name} has a {header[ticker_col]!r} column but no 'close' column (header: "
                           f"{','.join(header)}); name the column of closing prices close")
        width = max(date_col, ticker_col, close_col) + 1
        for number, row in enumerate(rows[1:], start=2):
            if not any(cell.strip() for cell in row):
                continue
            where = f"{name} line {number}"
            if len(row) < width:
                raise EnvError(f"{where} has {len(row)} cells but the header has {len(header)}; give every row "
                               "all the columns")
            date = _parse_date(row[date_col], where)
            ticker = row[ticker_col].strip()
            if not ticker:
                raise EnvError(f"{where} has no ticker; fill in the {header[ticker_col]} column")
            if not row[close_col].strip():
                continue
            if (date, ticker) in records:
                raise EnvError(f"{where} repeats {ticker} on {date}; keep one row per date and ticker")
            records[date, ticker] = _parse_price(row[close_col], ticker, date, where)
            file_tickers.append(ticker)
    else:  # wide layout
        columns = [(i, h) for i, h in enumerate(header) if i != date_col]
        if not columns:
            raise EnvError(f"{name} has a date column but no price columns; add one column of closes per ticker "
                           "(date,AAPL,MSFT) or use the long layout date,ticker,close")
        file_tickers = [h for _, h in columns]
        fields = [h for h in file_tickers if h.lower().replace("_", " ") in _PRICE_FIELDS]
        if fields:
            raise EnvError(f"{name} has columns {', '.join(fields)} but no ticker column, like one stock's price "
                           "history; use the long layout date,ticker,close (a ticker, tic or symbol column) or the "
                           "wide layout date,TICKER1,TICKER2,... with one column of closes per ticker")
        if len(set(file_tickers)) != len(file_tickers) or not all(file_tickers):
            raise EnvError(f"{name} has empty or repeated column names ({','.join(header)}); name each price column "
                           "by its ticker, once")
        seen: set[dt.date] = set()
        for number, row in enumerate(rows[1:], start=2):
            if not any(cell.strip() for cell in row):
                continue
            where = f"{name} line {number}"
            if len(row) != len(header):
                raise EnvError(f"{where} has {len(row)} cells but the header has {len(header)}; give every row "
                               "one cell per column (empty where there is no price)")
            date = _parse_date(row[date_col], where)
            if date in seen:
                raise EnvError(f"{where} repeats the date {date}; keep one row per date")
            seen.add(date)
            for i, ticker in columns:
                if row[i].strip():
                    records[date, ticker] = _parse_price(row[i], ticker, date, where)
    if not records:
        raise EnvError(f"{name} holds no prices; add rows under its header")
    return _market_from_records(records, file_tickers, tickers, name)


def load_bundled(tickers: Sequence[str] | None = None) -> Market:
    """The real prices bundled with the ``vega_datasets`` package, read from its installed files (no network).

    Its ``stocks.csv`` holds the closing prices of AAPL, AMZN, GOOG, IBM and MSFT on the first trading day of every
    month from January 2000 to March 2010 (GOOG from August 2004). The default tickers are :data:`BUNDLED_TICKERS`;
    selecting GOOG restricts the market to the dates it has.
    """
    spec = importlib.util.find_spec("vega_datasets")  # locates the package without importing it (and pandas)
    if spec is None or not spec.submodule_search_locations:
        raise EnvError("the bundled stock prices come from the vega_datasets package, which is not installed; "
                       "run `pip install 'jaderl[stock]'` or pass csv=PATH in the env id")
    path = Path(next(iter(spec.submodule_search_locations))) / "_data" / "stocks.csv"
    if not path.is_file():
        raise EnvError(f"the installed vega_datasets package has no {path}; reinstall it "
                       "(`pip install --force-reinstall vega_datasets`) or pass csv=PATH in the env id")
    records: dict[tuple[dt.date, str], float] = {}
    file_tickers: list[str] = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):  # symbol,date,price with dates like "Jan 1 2000"
            date = dt.datetime.strptime(row["date"], "%b %d %Y").date()
            records[date, row["symbol"]] = float(row["price"])
            file_tickers.append(row["symbol"])
    return _market_from_records(records, file_tickers, BUNDLED_TICKERS if tickers is None else tickers,
                                "the vega_datasets package's stocks.csv")


# --------------------------------------------------------------------------------------------------- the env id
@dataclasses.dataclass(frozen=True)
class StockOptions:
    """The options of a ``jaderl/StockTrading-v0?KEY=VALUE&...`` env id (see :func:`parse_env_id`)."""

    csv: str | None = None
    """Path of a price CSV (:func:`read_prices`); ``None``: the bundled prices (:func:`load_bundled`)."""
    tickers: tuple[str, ...] | None = None
    """Tickers to trade, in this order (``tickers=AAPL,MSFT``); ``None``: the data's default."""
    split: dt.date | None = None
    """First backtest date; training uses the dates before it. ``None``: 2008-01-01 for the bundled prices, the date
    80 % of the way through a CSV's dates otherwise."""
    cost: float = 0.001
    """Proportional transaction cost, charged on the value of every buy and every sell."""
    hmax: int = 1000
    """Most shares of one stock bought or sold in one step (an action of +-1)."""
    cash: float = 1_000_000.0
    """Initial cash (training replicas: times ``U(0.9, 1.1)``)."""
    episode: int | None = None
    """Training episode length in steps; ``None``: half of the usable training dates."""
    window: int = 5
    """Moving-average window, in periods, of the price / moving-average feature (at least 2)."""


def is_stock_id(name: str) -> bool:
    """Whether ``name`` is the stock-trading env id, with or without options."""
    return name == STOCK_ID or name.startswith(STOCK_ID + "?")


def parse_env_id(env_id: str) -> StockOptions:
    """The options of ``jaderl/StockTrading-v0?KEY=VALUE&KEY=VALUE`` (values may be %-encoded, e.g. ``%26`` for &).

    Raises:
        EnvError: an unknown, repeated or malformed option, or a value out of range.
    """
    base, _, query = env_id.partition("?")
    if base != STOCK_ID:
        raise EnvError(f"{env_id!r} is not a stock-trading env id; write {STOCK_ID} or {STOCK_ID}?split=YYYY-MM-DD")
    values: dict[str, str] = {}
    for part in query.split("&") if query else []:
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not key or not value.strip():
            raise EnvError(f"option {part!r} of env id {env_id!r} is not KEY=VALUE; write e.g. "
                           f"{STOCK_ID}?split=2008-01-01&cost=0.001")
        if key not in StockOptions.__dataclass_fields__:
            raise EnvError(f"unknown option {key!r} in env id {env_id!r}; the options are: {_OPTION_HELP}")
        if key in values:
            raise EnvError(f"option {key!r} appears twice in env id {env_id!r}; give it once")
        values[key] = unquote(value.strip())
    fields: dict[str, Any] = {}

    def number(key: str, kind: type, low: float, high: float = math.inf) -> None:
        if key not in values:
            return
        try:
            value = kind(values[key])
        except ValueError:
            value = None
        if value is None or not (low <= value < high):
            bounds = f"at least {low}" if high == math.inf else f"in [{low}, {high})"
            raise EnvError(f"option {key}={values[key]!r} of env id {env_id!r} is out of range: it must be "
                           f"{'an integer' if kind is int else 'a number'} {bounds}")
        fields[key] = value

    number("cost", float, 0.0, 1.0)
    number("hmax", int, 1)
    number("cash", float, 1e-6)
    number("episode", int, 1)
    number("window", int, 2)
    if "csv" in values:
        fields["csv"] = values["csv"]
    if "tickers" in values:
        tickers = tuple(t.strip() for t in values["tickers"].split(","))
        if not all(tickers):
            raise EnvError(f"tickers={values['tickers']!r} has an empty name; write tickers=AAPL,MSFT")
        fields["tickers"] = tickers
    if "split" in values:
        fields["split"] = _parse_date(values["split"], f"option split of env id {env_id!r}")
    return StockOptions(**fields)


def with_absolute_csv(env_id: str) -> str:
    """``env_id`` with a relative ``csv=`` path made absolute (from the current directory), every other option kept
    as written; ids without a relative ``csv`` come back unchanged. Run configs store this form, so resuming,
    evaluating and backtesting read the same file from any directory."""
    base, _, query = env_id.partition("?")
    if base != STOCK_ID or not query:
        return env_id
    parts = query.split("&")
    for i, part in enumerate(parts):
        key, sep, value = part.partition("=")
        if key.strip() == "csv" and sep and value.strip():
            path = Path(unquote(value.strip()))
            if not path.is_absolute():  # %-encoded again, so that ``&``, ``?`` or ``%`` in the path stay one value
                parts[i] = "csv=" + quote(str(path.expanduser().resolve()), safe="/\\:~")
    return f"{base}?{'&'.join(parts)}"


def load_market(options: StockOptions) -> Market:
    """The market an env with ``options`` trades: the CSV it names, or the bundled prices."""
    if options.csv is None:
        return load_bundled(options.tickers)
    return read_prices(options.csv, options.tickers)


# ------------------------------------------------------------------------------------------------------- the env
class StockTradingEnv(VecEnv):
    """FinRL-style stock trading: cash and shares of n stocks per replica, proportional costs, batched in torch.

    Action: ``(num_envs, n)`` floats in ``[-1, 1]`` (shares to trade, in units of ``hmax``; a tensor, or a list or
    NumPy array of numbers). Observation: ``(num_envs, 1 + 4 n)``. Reward: portfolio value change over the episode's
    initial value. See :mod:`jaderl.envs.stock`. On the CPU, NaN or infinite actions raise
    :class:`~jaderl.envs.vec.EnvError` before anything trades (on a GPU they are not checked: that would wait for the
    device every step).
    """

    is_discrete = False

    def __init__(
        self,
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int | None = None,
        env_id: str = STOCK_ID,
        backtest: bool = False,
    ) -> None:
        """Build ``num_envs`` replicas of the market named by ``env_id`` on ``device`` (observations in ``dtype``;
        the accounting is float64).

        ``backtest=False``: training episodes on the dates before the split, random start day and initial cash drawn
        from a ``torch.Generator`` seeded with ``seed``. ``backtest=True``: one deterministic episode over the dates
        from the split on.
        """
        if int(num_envs) < 1:
            raise EnvError(f"num_envs must be at least 1, got {num_envs}")
        if not dtype.is_floating_point:
            raise EnvError(f"dtype must be a floating-point dtype (float32 or float64), got {dtype}")
        self.env_id = env_id
        self.options = opts = parse_env_id(env_id)
        self.market = market = load_market(opts)
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self.dtype = dtype
        self.backtest = bool(backtest)
        self.n_stocks = n = len(market.tickers)
        self.action_dim = n
        self.obs_shape = (1 + 4 * n,)
        self.cost, self.hmax, self.initial_cash = opts.cost, opts.hmax, opts.cash

        dates, total = market.dates, len(market.dates)
        if opts.split is not None:
            split = opts.split
        elif opts.csv is None:
            split = BUNDLED_SPLIT
        else:
            split = dates[min(int(total * DEFAULT_SPLIT_FRACTION), total - 2)]
        first = opts.window - 1  # the first day with a full moving-average window
        split_index = market.split_index(split)
        if not (first + 2 <= split_index <= total - 2):
            low, high = dates[min(first + 2, total - 1)], dates[-2]
            raise EnvError(
                f"split {split} leaves {max(split_index - first - 1, 0)} training steps and "
                f"{max(total - 1 - split_index, 0)} backtest steps in {market.source} (dates {dates[0]} to "
                f"{dates[-1]}, window={opts.window}); choose a split between {low} and {high}"
                if low <= high else
                f"{market.source} has too few dates ({total}) for window={opts.window} and a split; use more dates "
                "or a smaller window")
        self.split_date, self.split_index = split, split_index
        train_steps = split_index - 1 - first  # steps from the first usable day to the last training day
        if self.backtest:
            self.max_steps = total - 1 - split_index
            self._start_low = self._start_high = split_index
        else:
            self.max_steps = opts.episode if opts.episode is not None else max(1, train_steps // 2)
            if self.max_steps > train_steps:
                raise EnvError(f"episode={self.max_steps} is longer than the {train_steps} training steps before "
                               f"the split {split}; use episode={train_steps} or less, or a later split")
            self._start_low, self._start_high = first, split_index - 1 - self.max_steps
        # the env's own dates: an episode never reaches beyond them (nor a training one into the backtest's)
        self._day_range = (split_index, total - 1) if self.backtest else (0, split_index - 1)
        self.periods_per_year = market.periods_per_year

        # market tensors: prices (T, n) float64 and the observed per-stock features (T, 3, n)
        prices = market.prices
        returns = np.zeros_like(prices)
        returns[1:] = prices[1:] / prices[:-1] - 1.0
        csum = np.cumsum(np.vstack([np.zeros((1, n)), prices]), axis=0)
        w = opts.window
        ma_ratio = np.zeros_like(prices)
        ma_ratio[first:] = prices[first:] / ((csum[w:] - csum[:-w]) / w) - 1.0
        fit = slice(max(first, 1), split_index)  # z-scores from the training dates only
        z_ret = (returns - returns[fit].mean(0)) / np.maximum(returns[fit].std(0), 1e-8)
        z_ma = (ma_ratio - ma_ratio[fit].mean(0)) / np.maximum(ma_ratio[fit].std(0), 1e-8)
        features = np.stack([prices / prices[0], z_ret, z_ma], axis=1)
        self.prices = torch.as_tensor(prices, dtype=torch.float64, device=self.device)
        """The closes ``(T, n)`` float64, indexed by day."""
        self._features = torch.as_tensor(features, dtype=dtype, device=self.device)

        self.generator = torch.Generator(device=self.device)
        """The env's random stream (start days, initial cash); its state is saved in checkpoints."""
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed_value(seed))
        self.day, self.cash = self._sample_starts()
        """Index of each replica's current date ``(num_envs,)`` int64, and its cash ``(num_envs,)`` float64."""
        self.holdings = torch.zeros(self.num_envs, n, dtype=torch.float64, device=self.device)
        """Shares held, ``(num_envs, n)`` float64 (whole numbers)."""
        self.initial_value = self.cash.clone()
        """Each replica's portfolio value when its episode began (the reward's denominator)."""
        self.elapsed_steps = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        self._fresh = True

    # ------------------------------------------------------------------------------------------------ state
    @property
    def dates(self) -> tuple[dt.date, ...]:
        """The market's dates (``day`` indexes them)."""
        return self.market.dates

    @property
    def tickers(self) -> tuple[str, ...]:
        """The traded tickers, in action and observation order."""
        return self.market.tickers

    @property
    def portfolio_value(self) -> torch.Tensor:
        """Cash plus holdings at today's close, ``(num_envs,)`` float64."""
        return self.cash + (self.holdings * self.prices[self.day]).sum(1)

    def _sample_starts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A start day and an initial cash for every replica (fixed in the backtest)."""
        if self.backtest:
            day = torch.full((self.num_envs,), self._start_low, dtype=torch.int64, device=self.device)
            return day, torch.full((self.num_envs,), self.initial_cash, dtype=torch.float64, device=self.device)
        day = torch.randint(self._start_low, self._start_high + 1, (self.num_envs,), generator=self.generator,
                            device=self.device)
        jitter = torch.rand(self.num_envs, generator=self.generator, device=self.device, dtype=torch.float64)
        return day, self.initial_cash * (1.0 + INITIAL_CASH_JITTER * (2.0 * jitter - 1.0))

    def _observe(self) -> torch.Tensor:
        price = self.prices[self.day]
        stock_value = self.holdings * price
        value = (self.cash + stock_value.sum(1)).clamp(min=1e-12)
        parts = [(self.cash / value).unsqueeze(1), self._features[self.day, 0],
                 stock_value / value.unsqueeze(1), self._features[self.day, 1], self._features[self.day, 2]]
        return torch.cat([p.to(self.dtype) for p in parts], dim=1)

    def set_state(self, day: torch.Tensor | Sequence[int], cash: torch.Tensor | Sequence[float],
                  holdings: torch.Tensor | Sequence[Sequence[float]] | None = None) -> torch.Tensor:
        """Start a new episode in every replica on day index ``day`` with ``cash`` and ``holdings`` (default none);
        returns the observation. Any day of the env's dates (the training ones, or with ``backtest=True`` those from
        the split on) that has a next one is allowed; the step counters restart at 0, and an episode is truncated
        at ``max_steps`` or on the last of those dates, whichever comes first."""
        day = torch.as_tensor(day, dtype=torch.int64, device=self.device).expand(self.num_envs).clone()
        low, high = self._day_range
        if bool(((day < low) | (day >= high)).any()):
            dates = "backtest" if self.backtest else "training"
            raise EnvError(f"day must index one of this env's {dates} dates that has a next one ({low} to "
                           f"{high - 1}), got {day.tolist()}")
        self.day = day
        self.cash = torch.as_tensor(cash, dtype=torch.float64, device=self.device).expand(self.num_envs).clone()
        if holdings is None:
            self.holdings.zero_()
        else:
            self.holdings = torch.as_tensor(holdings, dtype=torch.float64, device=self.device).expand(
                self.num_envs, self.n_stocks).clone()
        self.initial_value = self.portfolio_value
        self.elapsed_steps.zero_()
        self._fresh = False
        return self._observe()

    # ------------------------------------------------------------------------------------------ reset / step
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Dates, cash, holdings, starting values, step counters and the random stream: a copy trades on exactly."""
        return {"day": self.day.clone(), "cash": self.cash.clone(), "holdings": self.holdings.clone(),
                "initial_value": self.initial_value.clone(), "elapsed_steps": self.elapsed_steps.clone(),
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Continue from :meth:`state_dict` of an env with the same options and number of replicas."""
        n = self.num_envs
        *values, steps, generator = state_tensors(state, {
            "day": (n,), "cash": (n,), "holdings": (n, self.n_stocks), "initial_value": (n,), "elapsed_steps": (n,),
            "generator": None})
        self.day, self.cash, self.holdings, self.initial_value = (v.to(self.device, copy=True) for v in values)
        self.elapsed_steps.copy_(steps)
        self.set_rng_state(generator)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Start a new episode in every replica; ``seed`` re-seeds the generator first. The first ``reset()`` without a
        seed after construction keeps the starts drawn from the constructor's ``seed``."""
        if seed is not None:
            self.generator.manual_seed(seed_value(seed))
        elif self._fresh:
            self._fresh = False
            return self._observe()
        self._fresh = False
        self.day, self.cash = self._sample_starts()
        self.holdings.zero_()
        self.initial_value = self.cash.clone()
        self.elapsed_steps.zero_()
        return self._observe()

    def step(self, action: torch.Tensor) -> StepResult:
        """Trade at today's close (sells, then buys within the cash), move to the next date, reward the value change.

        ``action`` may also be a list or NumPy array of numbers, converted to a tensor on the env's device."""
        action = as_action_tensor(action, self.device, type(self).__name__)  # (a tensor: detached)
        if action.numel() != self.num_envs * self.n_stocks:
            raise EnvError(f"expected actions of shape {(self.num_envs, self.n_stocks)} (one per replica and stock), "
                           f"got a tensor of shape {tuple(action.shape)}")
        act = action.reshape(self.num_envs, self.n_stocks).to(device=self.device, dtype=torch.float64)
        if self.device.type == "cpu" and not bool(torch.isfinite(act).all()):  # (no host sync on the CPU)
            raise EnvError(NONFINITE_ACTIONS)
        order = torch.trunc(act.clamp(-1.0, 1.0) * self.hmax)  # signed whole shares
        price = self.prices[self.day]
        value_before = self.cash + (self.holdings * price).sum(1)
        sell = torch.minimum((-order).clamp(min=0.0), self.holdings)
        cash = self.cash + (sell * price).sum(1) * (1.0 - self.cost)
        holdings = self.holdings - sell
        buy = order.clamp(min=0.0)
        need = (buy * price).sum(1) * (1.0 + self.cost)
        scale = torch.where(need > cash, cash / need.clamp(min=1e-300), torch.ones_like(cash))
        buy = torch.floor(buy * scale.unsqueeze(1))
        cash = (cash - (buy * price).sum(1) * (1.0 + self.cost)).clamp(min=0.0)  # clamp: rounding, never > 1 ulp
        self.cash, self.holdings = cash, holdings + buy
        self.day = self.day + 1
        value = self.portfolio_value
        reward = ((value - value_before) / self.initial_value).to(torch.float32)
        steps = self.elapsed_steps.add_(1)
        truncated = (steps >= self.max_steps) | (self.day >= self._day_range[1])  # the latter only after set_state
        terminated = torch.zeros_like(truncated)
        final_obs = self._observe()
        new_day, new_cash = self._sample_starts()
        self.day = torch.where(truncated, new_day, self.day)
        self.cash = torch.where(truncated, new_cash, self.cash)
        self.holdings = self.holdings.masked_fill(truncated.unsqueeze(1), 0.0)
        self.initial_value = torch.where(truncated, new_cash, self.initial_value)
        steps.masked_fill_(truncated, 0)
        self._fresh = False
        return self._observe(), reward, terminated, truncated, {"final_obs": final_obs, "portfolio_value": value}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_envs={self.num_envs}, device={str(self.device)!r}, "
                f"env_id={self.env_id!r}, backtest={self.backtest})")


STOCK_ENVS: dict[str, type[VecEnv]] = {STOCK_ID: StockTradingEnv}
"""The stock-trading env id and its class (options after ``?`` are routed by :func:`jaderl.envs.make_env`)."""


# ------------------------------------------------------------------------------------------------ the backtest
@dataclasses.dataclass(frozen=True)
class Metrics:
    """Performance of one series of portfolio values (see :func:`portfolio_metrics`)."""

    cumulative_return: float
    """``V_end / V_0 - 1``."""
    annual_return: float
    """``(V_end / V_0) ** (periods_per_year / periods) - 1``."""
    sharpe_ratio: float
    """``sqrt(periods_per_year) * mean(r) / std(r)`` of the per-period returns ``r`` (risk-free rate 0, sample std);
    0 when the returns are constant."""
    max_drawdown: float
    """Largest fall from a running peak, as a positive fraction of that peak (0.25: a 25 % fall)."""
    final_value: float
    """``V_end``."""


def portfolio_metrics(values: Sequence[float] | np.ndarray, periods_per_year: int) -> Metrics:
    """Cumulative and annualised return, annualised Sharpe ratio and max drawdown of portfolio values ``V_0..V_end``
    taken once per period."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or len(v) < 2 or not (np.isfinite(v).all() and (v > 0).all()):
        raise EnvError("portfolio values must be at least 2 positive finite numbers, one per period")
    growth = v[-1] / v[0]
    periods = len(v) - 1
    returns = v[1:] / v[:-1] - 1.0
    std = float(returns.std(ddof=1)) if len(returns) > 1 else 0.0
    sharpe = math.sqrt(periods_per_year) * float(returns.mean()) / std if std > 1e-12 else 0.0
    drawdown = float((1.0 - v / np.maximum.accumulate(v)).max())
    annual = float(growth ** (periods_per_year / periods) - 1.0)
    return Metrics(cumulative_return=float(growth - 1.0), annual_return=annual, sharpe_ratio=sharpe,
                   max_drawdown=drawdown, final_value=float(v[-1]))


def buy_and_hold_values(prices: np.ndarray, cash: float, cost: float) -> np.ndarray:
    """Values of the equal-weight buy-and-hold baseline: on the first row, ``cash / n`` goes into each stock (fractional
    shares, paying the proportional ``cost``), then the shares are held. The first value is ``cash`` (before buying),
    like the agent's, so both series cover the same dates."""
    prices = np.asarray(prices, dtype=np.float64)
    shares = cash / prices.shape[1] / (prices[0] * (1.0 + cost))
    values = prices @ shares
    values[0] = cash
    return values


@dataclasses.dataclass(frozen=True)
class BacktestReport:
    """A policy's backtest against equal-weight buy-and-hold on the same dates (:func:`backtest`)."""

    env_id: str
    tickers: list[str]
    periods_per_year: int
    dates: list[str]
    """``YYYY-MM-DD`` of every value below: the first backtest date to the last date of the data."""
    agent: Metrics
    buy_and_hold: Metrics
    agent_values: list[float]
    buy_and_hold_values: list[float]

    def to_dict(self) -> dict[str, Any]:
        """Everything, as plain JSON-ready types."""
        return dataclasses.asdict(self)

    def format(self) -> str:
        """A short table for a terminal."""
        kinds = {365: "daily", 252: "daily", 52: "weekly", 12: "monthly", 4: "quarterly"}
        kind = kinds.get(self.periods_per_year, "yearly")
        lines = [f"backtest of {self.env_id}",
                 f"{', '.join(self.tickers)} from {self.dates[0]} to {self.dates[-1]}: {len(self.dates) - 1} {kind} "
                 f"periods ({self.periods_per_year} a year)",
                 f"{'':<20}{'agent':>14}{'buy-and-hold':>14}"]
        rows = [("cumulative return", "cumulative_return", "{:+.2%}"), ("annual return", "annual_return", "{:+.2%}"),
                ("Sharpe ratio", "sharpe_ratio", "{:.2f}"), ("max drawdown", "max_drawdown", "{:.2%}"),
                ("final value", "final_value", "{:,.0f}")]
        for label, key, fmt in rows:
            a, b = getattr(self.agent, key), getattr(self.buy_and_hold, key)
            lines.append(f"{label:<20}{fmt.format(a):>14}{fmt.format(b):>14}")
        return "\n".join(lines)


class Policy(Protocol):
    """Anything that maps a batch of observations to actions, as :class:`~jaderl.core.agent.Agent` does."""

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor: ...


@torch.no_grad()
def backtest(agent: Policy, env_id: str | None = None, device: str | torch.device | None = None) -> BacktestReport:
    """Run ``agent``'s deterministic policy once over the backtest dates of ``env_id`` (default: the env the agent
    was trained on, ``agent.config.env``) and compare it with equal-weight buy-and-hold.

    Deterministic: the episode starts on the first date on or after the split with exactly the initial cash.
    """
    if env_id is None:
        env_id = getattr(getattr(agent, "config", None), "env", None)
        if env_id is None:
            raise EnvError("backtest needs env_id= for an agent without a config")
    if not is_stock_id(env_id):
        raise EnvError(f"{env_id!r} is not a stock-trading env; backtest a run trained on {STOCK_ID} (with or "
                       "without options)")
    if device is None:
        device = getattr(agent, "device", "cpu")
    env = StockTradingEnv(1, device=device, env_id=env_id, backtest=True)
    obs = env.reset(seed=0)
    values = [env.portfolio_value]
    for _ in range(env.max_steps):
        obs, _, _, _, info = env.step(agent.act(obs, deterministic=True))
        values.append(info["portfolio_value"])
    agent_values = torch.cat(values).cpu().numpy()
    start = env.split_index
    baseline = buy_and_hold_values(env.market.prices[start:], env.initial_cash, env.cost)
    ppy = env.periods_per_year
    return BacktestReport(
        env_id=env_id, tickers=list(env.tickers), periods_per_year=ppy,
        dates=[d.isoformat() for d in env.dates[start:]],
        agent=portfolio_metrics(agent_values, ppy), buy_and_hold=portfolio_metrics(baseline, ppy),
        agent_values=[float(v) for v in agent_values], buy_and_hold_values=[float(v) for v in baseline])
