"""Tests of jaderl.envs.stock: accounting, batching, resets, CSV parsing, env-id options, metrics, backtest, CLI."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from action_checks import check_list_actions, check_refused_actions

from jaderl import api, cli
from jaderl.envs import TORCH_ENVS, make_env
from jaderl.envs.stock import (
    BUNDLED_TICKERS,
    STOCK_ID,
    StockTradingEnv,
    backtest,
    buy_and_hold_values,
    load_bundled,
    parse_env_id,
    periods_per_year,
    portfolio_metrics,
    read_prices,
    with_absolute_csv,
)
from jaderl.envs.vec import EnvError, VecEnv

# a tiny daily market: 10 days, 2 stocks; with window=2 and split 2020-01-06 the backtest runs from day 5 to day 9
TINY_A = [10, 11, 12, 13, 14, 10, 20, 5, 10, 10]
TINY_B = [50, 52, 51, 49, 50, 50, 40, 30, 35, 35]


def _tiny_csv(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.csv"
    rows = enumerate(zip(TINY_A, TINY_B, strict=True))
    lines = ["date,AAA,BBB"] + [f"2020-01-{d + 1:02d},{a},{b}" for d, (a, b) in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def _tiny_id(tmp_path: Path, **extra: object) -> str:
    options = {"csv": _tiny_csv(tmp_path), "split": "2020-01-06", "cost": 0.01, "hmax": 10, "cash": 1000,
               "window": 2, **extra}
    return STOCK_ID + "?" + "&".join(f"{k}={v}" for k, v in options.items())


def _synthetic_csv(tmp_path: Path, days: int = 80, stocks: int = 3, seed: int = 0) -> Path:
    """A random-walk market in the long layout (tests only)."""
    rng = np.random.default_rng(seed)
    prices = 50 * np.exp(np.cumsum(rng.normal(0, 0.02, (days, stocks)), axis=0))
    start = dt.date(2021, 1, 4)
    lines = ["date,ticker,close"]
    for t in range(days):
        for i in range(stocks):
            lines.append(f"{start + dt.timedelta(days=t)},S{i},{prices[t, i]:.4f}")
    path = tmp_path / "synthetic.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


# ------------------------------------------------------------------------------------------------ accounting
def test_accounting_matches_a_hand_computed_reference(tmp_path: Path) -> None:
    env = StockTradingEnv(1, env_id=_tiny_id(tmp_path), backtest=True, dtype=torch.float64)
    assert env.tickers == ("AAA", "BBB") and env.split_index == 5 and env.max_steps == 4
    obs = env.reset()
    assert env.day.item() == 5 and env.cash.item() == 1000 and (env.holdings == 0).all()
    assert obs[0, 0].item() == 1.0  # all cash
    # day 5 (A=10, B=50): buy 10 + 10 for (100 + 500) * 1.01 = 606; day 6 (A=20, B=40): 394 + 200 + 400 = 994
    obs, reward, terminated, truncated, info = env.step(torch.tensor([[1.0, 1.0]]))
    assert env.cash.item() == pytest.approx(394.0) and env.holdings.tolist() == [[10.0, 10.0]]
    assert reward.item() == pytest.approx((994 - 1000) / 1000) and info["portfolio_value"].item() == pytest.approx(994)
    assert not terminated.item() and not truncated.item()
    # day 6: -0.55 * 10 -> sell 5 A for 5 * 20 * 0.99 = 99, buy 10 B for 404; day 7 (A=5, B=30): 89 + 25 + 600 = 714
    obs, reward, *_ = env.step(torch.tensor([[-0.55, 1.0]]))
    assert env.cash.item() == pytest.approx(89.0) and env.holdings.tolist() == [[5.0, 20.0]]
    assert reward.item() == pytest.approx((714 - 994) / 1000)
    # day 7: sell 10 A but only 5 are held (+24.75); buying 10 B needs 303 > 113.75: floor(10 * 113.75 / 303) = 3
    obs, reward, *_ = env.step(torch.tensor([[-1.0, 1.0]]))
    assert env.holdings.tolist() == [[0.0, 23.0]]
    assert env.cash.item() == pytest.approx(113.75 - 3 * 30 * 1.01)
    value = 113.75 - 90.9 + 23 * 35  # day 8: B = 35
    assert reward.item() == pytest.approx((value - 714) / 1000)
    cash_fraction, weights = obs[0, 0].item(), obs[0, 3:5].tolist()
    assert cash_fraction == pytest.approx((113.75 - 90.9) / value) and weights == pytest.approx([0, 23 * 35 / value])
    assert obs[0, 1:3].tolist() == pytest.approx([10 / 10, 35 / 50])  # prices over the first day's
    # day 8: 10 B would cost 353.5, the cash (22.85) scales that to 0.65 shares: rounded down, nothing is bought
    obs, reward, terminated, truncated, info = env.step(torch.tensor([[0.0, 1.0]]))
    assert truncated.item() and not terminated.item()  # the last backtest step
    assert info["portfolio_value"].item() == pytest.approx(value)  # day 9 prices equal day 8's, nothing traded
    assert reward.item() == pytest.approx(0.0, abs=1e-12)
    assert info["final_obs"][0, 4].item() == pytest.approx(23 * 35 / value)  # weight of B before the reset
    assert env.day.item() == 5 and env.cash.item() == 1000 and obs[0, 0].item() == 1.0  # deterministic restart


def test_costs_are_charged_on_both_sides(tmp_path: Path) -> None:
    """Buying and selling back at an unchanged price loses exactly the cost on both trades."""
    env = StockTradingEnv(1, env_id=_tiny_id(tmp_path, cost=0.002, episode=3), dtype=torch.float64)
    env.set_state([1], [1000.0])  # A: 11 -> 12 -> 13, compare with a zero-cost env on the same path
    free = StockTradingEnv(1, env_id=_tiny_id(tmp_path, cost=0, episode=3), dtype=torch.float64)
    free.set_state([1], [1000.0])
    for act in ([[1.0, 0.0]], [[-1.0, 0.0]]):
        env.step(torch.tensor(act))
        free.step(torch.tensor(act))
    fees = 10 * 11 * 0.002 + 10 * 12 * 0.002
    assert free.cash.item() - env.cash.item() == pytest.approx(fees)
    assert free.cash.item() == pytest.approx(1000 + 10 * (12 - 11))


def test_batched_replicas_agree_with_each_replica_alone(tmp_path: Path) -> None:
    env_id = STOCK_ID + f"?csv={_synthetic_csv(tmp_path)}&episode=6&hmax=50&cash=20000"
    n = 7
    env = StockTradingEnv(n, env_id=env_id, seed=5, dtype=torch.float64)
    obs = env.reset()
    days, cash = env.day.clone(), env.cash.clone()
    assert len(set(days.tolist())) > 1 and len(set(cash.tolist())) == n  # replicas differ
    singles = [StockTradingEnv(1, env_id=env_id, dtype=torch.float64) for _ in range(n)]
    for i, single in enumerate(singles):
        torch.testing.assert_close(single.set_state(days[i : i + 1], cash[i : i + 1]), obs[i : i + 1])
    gen = torch.Generator().manual_seed(0)
    for _ in range(6):  # a whole episode: the last step truncates every replica
        action = torch.rand(n, env.action_dim, generator=gen, dtype=torch.float64) * 2 - 1
        batched = env.step(action)
        for i, single in enumerate(singles):
            alone = single.step(action[i : i + 1])
            torch.testing.assert_close(alone[4]["final_obs"], batched[4]["final_obs"][i : i + 1], rtol=0, atol=0)
            torch.testing.assert_close(alone[1], batched[1][i : i + 1], rtol=0, atol=0)
            assert alone[3].item() == batched[3][i].item()
            torch.testing.assert_close(alone[4]["portfolio_value"], batched[4]["portfolio_value"][i : i + 1])


def test_auto_reset_and_final_obs(tmp_path: Path) -> None:
    env_id = STOCK_ID + f"?csv={_synthetic_csv(tmp_path)}&episode=3&hmax=100&cash=50000"
    n = 64
    env = make_env(env_id, n, "cpu", seed=1)
    assert isinstance(env, StockTradingEnv) and isinstance(env, VecEnv) and env.max_steps == 3
    obs = env.reset()
    assert obs.shape == (n, 1 + 4 * 3) and obs.dtype == torch.float32 and env.action_dim == 3 and not env.is_discrete
    assert ((env.cash >= 45000) & (env.cash <= 55000)).all()
    assert env.day.min().item() >= env.options.window - 1 and env.day.max().item() <= env.split_index - 1 - 3
    buy = torch.ones(n, 3)
    for t in range(3):
        before_value, initial_value = env.portfolio_value.clone(), env.initial_value.clone()
        obs, reward, terminated, truncated, info = env.step(buy)
        assert reward.dtype == torch.float32 and terminated.dtype == truncated.dtype == torch.bool
        assert not terminated.any()
        if t < 2:
            assert not truncated.any() and torch.equal(info["final_obs"], obs)
            assert (obs[:, 0] < 1).all()  # shares were bought
        else:
            assert truncated.all()
            assert (info["final_obs"][:, 0] < 1).all()  # the state reached, before the reset
            assert (obs[:, 0] == 1).all() and (obs[:, 4:7] == 0).all()  # fresh episodes: all cash
            assert (env.elapsed_steps == 0).all() and (env.holdings == 0).all()
            torch.testing.assert_close(env.initial_value, env.cash)
        expected = (info["portfolio_value"] - before_value) / initial_value  # each replica's own initial value
        torch.testing.assert_close(reward, expected.float())


def test_seeding_and_bad_actions(tmp_path: Path) -> None:
    env_id = STOCK_ID + f"?csv={_synthetic_csv(tmp_path)}"
    a, b = StockTradingEnv(8, env_id=env_id, seed=3), StockTradingEnv(8, env_id=env_id)
    torch.testing.assert_close(a.reset(), b.reset(seed=3))
    assert torch.equal(a.day, b.day) and torch.equal(a.cash, b.cash)
    with pytest.raises(EnvError, match="expected actions of shape"):
        a.step(torch.zeros(8, 2))
    state, expected = a.generator.get_state(), a.reset()  # a checkpoint's stream, not the constructor's draw
    c = StockTradingEnv(8, env_id=env_id, seed=3)
    c.set_rng_state(state)
    torch.testing.assert_close(c.reset(), expected)
    assert not torch.equal(c.day, b.day)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_actions_are_refused_and_trade_nothing(tmp_path: Path, bad: float) -> None:
    env = StockTradingEnv(2, env_id=STOCK_ID + f"?csv={_synthetic_csv(tmp_path)}", seed=0)
    env.reset()
    cash, holdings = env.cash.clone(), env.holdings.clone()
    action = torch.zeros(2, 3)
    action[0, 1] = bad
    with pytest.raises(EnvError, match="NaN or infinite"):
        env.step(action)
    assert torch.equal(env.cash, cash) and torch.equal(env.holdings, holdings)  # no replica's books were touched
    obs, reward, *_ = env.step(torch.zeros(2, 3))
    assert torch.isfinite(obs).all() and torch.isfinite(reward).all()


# ------------------------------------------------------------------------------------------- CSV and options
def test_long_and_wide_csv_layouts(tmp_path: Path) -> None:
    long = tmp_path / "long.csv"
    long.write_text("Date,tic,Open,price\n2020-01-03,X,1,3.0\n2020-01-02,X,1,2.0\n2020-01-02,Y,1,20\n"
                    "2020-01-03,Y,1,30\n2020-01-06,X,1,4\n2020-01-06,Y,1,40\n2020-01-07,X,1,5\n")
    market = read_prices(long)
    assert market.tickers == ("X", "Y")
    assert [d.isoformat() for d in market.dates] == ["2020-01-02", "2020-01-03", "2020-01-06"]  # 01-07 lacks Y
    assert market.prices.tolist() == [[2, 20], [3, 30], [4, 40]]
    assert read_prices(long, ["Y", "X"]).prices.tolist() == [[20, 2], [30, 3], [40, 4]]
    wide = tmp_path / "wide.csv"
    wide.write_text("date,X,Y\n2020-01-02,2,20\n2020-01-03,3,\n2020-01-06,4,40\n2020-01-07,5,50\n")
    market = read_prices(wide)
    assert market.prices.tolist() == [[2, 20], [4, 40], [5, 50]] and market.periods_per_year == 252


@pytest.mark.parametrize(("content", "message"), [
    ("day,ticker,close\n2020-01-02,X,1\n", "has no 'date' column"),
    ("date,ticker,open\n2020-01-02,X,1\n", "no 'close' column"),
    ("date\n2020-01-02\n", "no price columns"),
    ("date,ticker,close\nJan 2 2020,X,1\n", "line 2: cannot read the date 'Jan 2 2020'; write dates as YYYY-MM-DD"),
    ("date,X\n2020-01-02,1\n2020-01-03,0\n", r"line 3: the price of X on 2020-01-03 is '0'; every price must be"),
    ("date,ticker,close\n2020-01-02,X,-5\n", "the price of X on 2020-01-02 is '-5'"),
    ("date,ticker,close\n2020-01-02,X,abc\n", "is 'abc'; every price must be a positive number"),
    ("date,ticker,close\n2020-01-02,X,1\n2020-01-02,X,2\n", "line 3 repeats X on 2020-01-02"),
    ("date,ticker,close\n2020-01-02,X,1\n2020-01-03,X,2\n", "has 2 dates on which all of X have a price"),
    ("Date,Open,High,Low,Close,Adj Close,Volume\n2020-01-02,1,2,1,2,2,100\n",
     "has columns Open, High, Low, Close, Adj Close, Volume but no ticker column, like one stock's price history"),
    ("date,symbl,close\n2020-01-02,X,1\n", "has columns close but no ticker column"),
])
def test_csv_errors_name_the_problem_and_the_fix(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(EnvError, match=message):
        read_prices(path)


def test_csv_encodings(tmp_path: Path) -> None:
    """A spreadsheet's "CSV UTF-8" export starts with a byte-order mark; text in another encoding is one sentence."""
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbfdate,ticker,close\n2020-01-02,X,1\n2020-01-03,X,2\n2020-01-06,X,3\n")
    assert read_prices(bom).tickers == ("X",)
    latin = tmp_path / "latin.csv"
    latin.write_bytes(b"date,ticker,close\n2020-01-02,Soci\xe9t\xe9,1\n")
    with pytest.raises(EnvError, match=r"latin.csv is not UTF-8 text \(.*\); save it as UTF-8 CSV$"):
        read_prices(latin)


def test_episodes_stay_within_the_envs_own_dates(tmp_path: Path) -> None:
    """set_state may start anywhere in the env's dates; the episode then ends on their last day, before the data
    ends (backtest) or before the split (training): no index error, no backtest price in training."""
    env = StockTradingEnv(1, env_id=_tiny_id(tmp_path, episode=3), dtype=torch.float64)  # training days 0-4
    env.set_state([3], [1000.0])
    _, _, _, truncated, info = env.step(torch.zeros(1, 2))
    assert truncated.item()  # after one step of the 3: on day 4, the last before the split
    assert info["final_obs"][0, 1:3].tolist() == pytest.approx([14 / 10, 50 / 50])  # day 4's prices
    test = StockTradingEnv(1, env_id=_tiny_id(tmp_path), backtest=True, dtype=torch.float64)  # days 5-9
    test.set_state([8], [1000.0])
    _, _, _, truncated, _ = test.step(torch.zeros(1, 2))
    assert truncated.item() and test.day.item() == 5  # reached day 9, then restarted where the backtest starts
    for bad, which, days in ((env, [4], "training dates that has a next one \\(0 to 3\\)"),
                             (env, [6], "training"), (test, [4], "backtest dates that has a next one \\(5 to 8\\)"),
                             (test, [9], "backtest")):
        with pytest.raises(EnvError, match=f"^day must index one of this env's {days}"):
            bad.set_state(which, [1000.0])


def test_env_id_options_and_their_errors(tmp_path: Path) -> None:
    csv_path = _synthetic_csv(tmp_path, days=40)
    opts = parse_env_id(STOCK_ID + f"?csv={csv_path}&tickers=S2,S0&split=2021-02-01&cost=0.002&hmax=7&cash=5e4"
                                   "&episode=4&window=3")
    assert opts.tickers == ("S2", "S0") and opts.split == dt.date(2021, 2, 1) and opts.cost == 0.002
    assert opts.hmax == 7 and opts.cash == 5e4 and opts.episode == 4 and opts.window == 3
    env = make_env(STOCK_ID + f"?csv={csv_path}&tickers=S2,S0&split=2021-02-01&episode=4", 2, "cpu", seed=0)
    assert env.tickers == ("S2", "S0") and env.dates[env.split_index] == dt.date(2021, 2, 1) and env.max_steps == 4
    assert parse_env_id(STOCK_ID).csv is None
    bad = {
        "?cost=2": "cost='2' .* out of range",
        "?hmax=0": "hmax='0' .* out of range",
        "?colour=red": "unknown option 'colour'.*the options are: csv, tickers",
        "?cost": "is not KEY=VALUE",
        "?split=yesterday": "cannot read the date 'yesterday'",
        f"?csv={tmp_path / 'missing.csv'}": "does not exist; give csv= the path of an existing CSV file",
        f"?csv={csv_path}&tickers=S0,ZZZ": "ticker 'ZZZ' is not in .* fix tickers=",
        f"?csv={csv_path}&split=2030-01-01": r"2030-01-01 leaves .* choose a split between 2021-01-10 and 2021-02-11",
        f"?csv={csv_path}&split=1999-01-01": r"split 1999-01-01 leaves 0 training steps .* choose a split between",
        f"?csv={csv_path}&episode=500": "episode=500 is longer than the",
    }
    for suffix, message in bad.items():
        with pytest.raises(EnvError, match=message):
            make_env(STOCK_ID + suffix, 1)
    with pytest.raises(EnvError, match="unknown env"):
        make_env("jaderl/StockTrading-v9", 1)


def test_bundled_market_and_registration(capsys: pytest.CaptureFixture[str]) -> None:
    market = load_bundled()
    assert market.tickers == BUNDLED_TICKERS and len(market.dates) == 123 and market.periods_per_year == 12
    assert market.dates[0] == dt.date(2000, 1, 1) and market.dates[-1] == dt.date(2010, 3, 1)
    assert market.prices[0].tolist() == [25.94, 64.56, 100.52, 39.81]  # AAPL, AMZN, IBM, MSFT in January 2000
    assert len(load_bundled(["GOOG", "MSFT"]).dates) == 68  # GOOG starts in August 2004
    assert TORCH_ENVS[STOCK_ID] is StockTradingEnv
    env = make_env(STOCK_ID, 4, "cpu", seed=0)
    assert env.split_index == 96 and env.dates[96] == dt.date(2008, 1, 1) and env.obs_shape == (17,)
    assert cli.main(["envs"]) == 0 and STOCK_ID in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------- metrics
def test_metrics_against_reference_formulas() -> None:
    values = [100.0, 110.0, 88.0, 120.0, 108.0, 130.0]
    m = portfolio_metrics(values, 12)
    returns = np.array([values[i + 1] / values[i] - 1 for i in range(5)])
    sharpe = math.sqrt(12) * returns.mean() / returns.std(ddof=1)
    peak, drawdown = values[0], 0.0
    for v in values:
        peak = max(peak, v)
        drawdown = max(drawdown, (peak - v) / peak)
    assert m.cumulative_return == pytest.approx(0.3) and m.annual_return == pytest.approx(1.3 ** (12 / 5) - 1)
    assert m.sharpe_ratio == pytest.approx(sharpe) and m.max_drawdown == pytest.approx(drawdown) == pytest.approx(0.2)
    assert m.final_value == 130.0
    flat = portfolio_metrics([5.0, 5.0, 5.0], 252)
    assert flat.cumulative_return == flat.annual_return == flat.sharpe_ratio == flat.max_drawdown == 0.0
    with pytest.raises(EnvError):
        portfolio_metrics([1.0], 12)
    start = dt.date(2020, 1, 1)
    assert periods_per_year([start + dt.timedelta(days=d) for d in (0, 1, 2, 5, 6)]) == 252
    assert periods_per_year([start + dt.timedelta(days=d) for d in range(30)]) == 365  # weekends too: crypto
    assert periods_per_year([start + dt.timedelta(weeks=w) for w in range(5)]) == 52
    assert periods_per_year([dt.date(2020, m, 1) for m in range(1, 7)]) == 12


def test_buy_and_hold_baseline() -> None:
    prices = np.array([[10.0, 50.0], [20.0, 40.0], [5.0, 30.0]])
    values = buy_and_hold_values(prices, 1000.0, 0.01)
    a, b = 500 / (10 * 1.01), 500 / (50 * 1.01)
    assert values.tolist() == pytest.approx([1000, 20 * a + 40 * b, 5 * a + 30 * b])


class _Constant:
    def __init__(self, value: float) -> None:
        self.value = value

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        return torch.full((obs.shape[0], 2), self.value)


class _ObsDriven:
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        return torch.tanh(obs[:, 5:7] * 3 - obs[:, 1:3])


def test_backtest_is_deterministic_and_compares_with_buy_and_hold(tmp_path: Path) -> None:
    env_id = _tiny_id(tmp_path)
    idle = backtest(_Constant(0.0), env_id)
    assert idle.dates == [f"2020-01-{d:02d}" for d in range(6, 11)] and idle.tickers == ["AAA", "BBB"]
    assert idle.agent_values == [1000.0] * 5 and idle.agent.cumulative_return == 0 and idle.periods_per_year == 252
    prices = np.array([TINY_A[5:], TINY_B[5:]], dtype=np.float64).T
    assert idle.buy_and_hold_values == pytest.approx(buy_and_hold_values(prices, 1000, 0.01).tolist())
    assert idle.buy_and_hold == portfolio_metrics(idle.buy_and_hold_values, 252)
    first, second = backtest(_ObsDriven(), env_id), backtest(_ObsDriven(), env_id)
    assert first == second and first.agent_values != idle.agent_values
    bought = backtest(_Constant(1.0), env_id)
    assert bought.agent_values[:2] == pytest.approx([1000, 994])  # the hand-computed first step above
    assert json.loads(json.dumps(bought.to_dict()))["agent"]["final_value"] == bought.agent.final_value
    assert "buy-and-hold" in bought.format() and "Sharpe ratio" in bought.format()


def test_backtest_refuses_other_envs() -> None:
    class Config:
        env = "jaderl/CartPole-v1"

    class Agent(_Constant):
        config = Config()

    with pytest.raises(EnvError, match="is not a stock-trading env"):
        backtest(Agent(0.0))


# ------------------------------------------------------------------------------------------------ end to end
def test_train_resume_and_backtest_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "ppo-stock"
    settings = dict(num_envs=8, horizon=16, minibatch_size=64, num_epochs=2, hidden=[32, 32], eval_every=256,
                    checkpoint_every=256, eval_episodes=2, device="cpu", seed=0)
    result = api.train("ppo", STOCK_ID, total_steps=512, run_dir=str(run_dir), **settings)
    assert result.steps == 512 and math.isfinite(result.best_eval_return)
    assert api.resume(run_dir, total_steps=768).steps == 768
    capsys.readouterr()
    assert cli.main(["backtest", str(run_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    market = load_bundled()
    start = market.dates.index(dt.date(2008, 1, 1))
    assert report["env_id"] == STOCK_ID and report["dates"][0] == "2008-01-01" and report["dates"][-1] == "2010-03-01"
    assert len(report["agent_values"]) == len(report["dates"]) == 27 and report["agent_values"][0] == 1_000_000
    baseline = buy_and_hold_values(market.prices[start:], 1_000_000, 0.001)
    assert report["buy_and_hold"]["cumulative_return"] == pytest.approx(baseline[-1] / 1e6 - 1)
    assert report["agent"]["max_drawdown"] >= 0 and math.isfinite(report["agent"]["sharpe_ratio"])
    assert cli.main(["backtest", str(run_dir)]) == 0
    assert "cumulative return" in capsys.readouterr().out


def test_a_relative_csv_path_is_found_from_any_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data dir & more"  # a space and an ampersand: the path must stay one option value
    data.mkdir()
    csv_path = _synthetic_csv(data)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(data)
    relative = STOCK_ID + f"?csv={csv_path.name}&episode=4&hmax=50"
    assert with_absolute_csv(STOCK_ID) == STOCK_ID and with_absolute_csv("Pendulum-v1") == "Pendulum-v1"
    absolute = with_absolute_csv(relative)
    assert parse_env_id(absolute) == dataclasses.replace(parse_env_id(relative), csv=str(csv_path.resolve()))
    assert with_absolute_csv(absolute) == absolute  # already absolute: unchanged
    run_dir = tmp_path / "run"
    settings = dict(num_envs=4, horizon=8, minibatch_size=16, num_epochs=1, hidden=[16], eval_every=32,
                    checkpoint_every=32, eval_episodes=1, device="cpu", seed=0)
    result = api.train("ppo", relative, total_steps=32, run_dir=str(run_dir), **settings)
    assert result.steps == 32 and api.make_config("ppo", relative).env == absolute
    monkeypatch.chdir(elsewhere)  # the relative path no longer names the file from here
    assert api.resume(run_dir, total_steps=64).steps == 64
    capsys.readouterr()
    assert cli.main(["backtest", str(run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["env_id"] == absolute


def test_lists_and_numpy_actions_trade_as_the_same_tensor(tmp_path: Path) -> None:
    """A list, tuple or NumPy array of actions trades as the same tensor would; what is not numbers is refused in one
    sentence naming what the env takes, and trades nothing."""
    env = StockTradingEnv(2, env_id=STOCK_ID + f"?csv={_synthetic_csv(tmp_path)}", seed=0)
    env.reset()
    before = {k: v.clone() for k, v in env.state_dict().items()}
    check_list_actions(env, [[0.5, -0.25, 1.0], [0.0, 0.75, -1.0]], lambda: env.load_state_dict(before))
    env.load_state_dict(before)
    check_refused_actions(env, name="StockTradingEnv", junk=(["buy", "sell"], [[0.5], [0.5, 0.5]], None))
    after = env.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
