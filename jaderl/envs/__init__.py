"""Batched environments: the contract (:mod:`jaderl.envs.vec`), torch-native envs and :func:`make_env`."""

from __future__ import annotations

import contextlib
import inspect
import math
import numbers
from collections.abc import Callable, Iterator

import torch

from jaderl.envs.atari import is_atari_id, make_atari_env
from jaderl.envs.chasing import CHASING_ENVS
from jaderl.envs.classic import MORE_TORCH_ENVS
from jaderl.envs.classic import TORCH_ENVS as _CLASSIC_ENVS
from jaderl.envs.mpe import MPE_ENVS
from jaderl.envs.stock import STOCK_ENVS, StockTradingEnv, is_stock_id
from jaderl.envs.vec import EnvError, EnvSpec, GymnasiumVecEnv, VecEnv, seed_value

TORCH_ENVS: dict[str, type[VecEnv]] = {**_CLASSIC_ENVS, **MORE_TORCH_ENVS, **CHASING_ENVS, **STOCK_ENVS, **MPE_ENVS}
"""Every torch-native env id and its class; each class takes ``(num_envs, device, dtype, seed)``."""

EnvFactory = Callable[[int, torch.device, "int | None"], VecEnv]
"""Builds ``num_envs`` sub-envs on a device with a seed: ``factory(num_envs, device, seed) -> VecEnv``."""

REGISTERED_ENVS: dict[str, EnvFactory] = {}
"""Env ids added by :func:`register_env`."""

__all__ = ["NOT_GYMNASIUM", "REGISTERED_ENVS", "SIMULATORS", "TORCH_ENVS", "EnvError", "EnvSpec", "GymnasiumVecEnv",
           "VecEnv", "make_env", "register_env"]


def register_env(name: str, factory: EnvFactory) -> None:
    """Make ``name`` an env id that :func:`make_env`, ``jaderl.train`` and the Trainer build with ``factory(num_envs,
    device, seed)``: the way to train on a simulator jaderl has no id for, such as an Isaac Lab task or a ManiSkill3
    env wrapped in :class:`~jaderl.envs.torch_vector.TorchVectorEnv` (docs/simulators.md). The evaluator builds a
    second env of the same id with ``eval_episodes`` sub-envs."""
    if not name or "?" in name or name in TORCH_ENVS:
        raise EnvError(f"cannot register env {name!r}: choose a new id without '?' (the built-in ids are taken)")
    REGISTERED_ENVS[name] = factory


def _options(name: str, query: str, env_cls: type | None = None) -> dict[str, bool | int | float | str]:
    """``key=value&...`` of an env id as constructor options: true/false, integers and floats read as such.

    With ``env_cls`` (a torch-native env), each option is checked against the constructor's signature: an option
    annotated ``bool`` takes true/false (or 1/0), ``int`` a whole number, ``float`` a finite number, ``str`` the text
    as written; an option the constructor does not take, or one jaderl sets itself (``num_envs``, ``device``,
    ``dtype``, ``seed``), is refused. Every option may be given once."""
    options: dict[str, bool | int | float | str] = {}
    texts: dict[str, str] = {}
    for item in filter(None, query.split("&")):
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise EnvError(f"env option {item!r} in {name!r} is malformed: write KEY=VALUE, e.g. ?continuous=true")
        if key in options:
            raise EnvError(f"env option {key!r} appears twice in {name!r}; give it once")
        value: bool | int | float | str = {"true": True, "false": False}.get(text.lower(), text)
        for kind in (int, float):
            if isinstance(value, str):
                with contextlib.suppress(ValueError):
                    value = kind(text)
        options[key], texts[key] = value, text
    if env_cls is not None:
        options = {key: _typed_option(name, env_cls, key, value, texts[key]) for key, value in options.items()}
    return options


_SET_BY_JADERL = ("num_envs", "device", "dtype", "seed")
"""Constructor arguments of every torch-native env that jaderl passes itself, never options of an id."""

_OPTION_KINDS: dict[object, type] = {bool: bool, int: int, float: float, str: str, "bool": bool, "int": int,
                                     "float": float, "str": str}
"""Annotations (objects, or strings under ``from __future__ import annotations``) an option's value is checked by."""


def _typed_option(name: str, env_cls: type, key: str, value: bool | int | float | str,
                  text: str) -> bool | int | float | str:
    """``value`` as the type of ``env_cls``'s parameter ``key``, or one EnvError naming the option and what it takes."""
    params = inspect.signature(env_cls).parameters
    own = [p for p in params if p not in _SET_BY_JADERL and params[p].kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    base = name.partition("?")[0]
    if key in _SET_BY_JADERL:
        where = "" if key == "dtype" else f" and set {key} in the config (or pass it to make_env)"
        raise EnvError(f"env option {key!r} in {name!r} is jaderl's to set, not the id's; remove it{where}")
    if key not in own:
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return value
        listed = f"its options are: {', '.join(own)}" if own else "it takes none"
        raise EnvError(f"env {base!r} has no option {key!r}; {listed}")
    param = params[key]
    kind = _OPTION_KINDS.get(param.annotation) or next(
        (k for k in (bool, int, float, str) if type(param.default) is k), None)  # bool first: True is an int
    example = f", e.g. ?{key}={param.default}" if type(param.default) in (int, float) else ""
    if kind is bool:
        if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
            return bool(value)
        raise EnvError(f"env option {key}={text!r} in {name!r} must be true or false")
    if kind is int:
        if isinstance(value, float) and value.is_integer():  # 1e3, 4.0
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise EnvError(f"env option {key}={text!r} in {name!r} must be a whole number{example}")
    if kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        raise EnvError(f"env option {key}={text!r} in {name!r} must be a number{example}")
    if kind is str:
        return text
    return value


@contextlib.contextmanager
def _options_taken(name: str) -> Iterator[None]:
    """An option the env does not take (a TypeError of its constructor, for an id with options) as one EnvError
    naming the env id."""
    try:
        yield
    except TypeError as exc:
        if "?" not in name:
            raise
        raise EnvError(f"env {name!r}: {exc}".replace(".__init__()", "") + "; see the env's docstring for its "
                       "options") from None


def _vmas(name: str, num_envs: int, device: torch.device | str, seed: int | None, workers: int) -> VecEnv:
    """VMAS scenarios, batched on the device already (pip install 'jaderl[vmas]')."""
    from jaderl.envs.vmas import VmasVecEnv, make_vmas_env

    base, _, query = name.partition("?")  # vmas/navigation?n_agents=2: the scenario's own options; continuous and
    with _options_taken(name):  # max_steps are the adapter's (typed)
        return make_vmas_env(base, num_envs, device, seed=seed, **_options(name, query, VmasVecEnv))


def _brax(name: str, num_envs: int, device: torch.device | str, seed: int | None, workers: int) -> VecEnv:
    """Brax's JAX simulators through DLPack (pip install 'jaderl[brax]')."""
    from jaderl.envs.brax import make_brax_env

    base, _, query = name.partition("?")
    return make_brax_env(base, num_envs, device, seed=seed, **_options(name, query))


def _playground(name: str, num_envs: int, device: torch.device | str, seed: int | None, workers: int) -> VecEnv:
    """MuJoCo Playground's MJX / MuJoCo Warp envs (pip install 'jaderl[playground]')."""
    from jaderl.envs.brax import make_playground_env

    base, _, query = name.partition("?")
    return make_playground_env(base, num_envs, device, seed=seed, **_options(name, query))


def _maniskill(name: str, num_envs: int, device: torch.device | str, seed: int | None, workers: int) -> VecEnv:
    """ManiSkill3's tasks, tensors as they are (pip install 'jaderl[maniskill]')."""
    from jaderl.envs.torch_vector import make_maniskill_env

    base, _, query = name.partition("?")
    with _options_taken(name):  # maniskill/PickCube-v1?control_mode=pd_ee_delta_pose: gym.make's options
        return make_maniskill_env(base, num_envs, device, seed=seed, **_options(name, query))


def _pettingzoo(name: str, num_envs: int, device: torch.device | str, seed: int | None, workers: int) -> VecEnv:
    """Any PettingZoo parallel env by module path (pip install 'jaderl[marl]')."""
    from jaderl.envs.pettingzoo import make_pettingzoo_env

    base, _, query = name.partition("?")
    with _options_taken(name):  # pettingzoo/mpe2.simple_spread_v3?N=4: parallel_env(N=4)
        return make_pettingzoo_env(base, num_envs, device, seed=seed, workers=workers, **_options(name, query))


JADERL_PREFIX = "jaderl/"
"""The prefix of jaderl's own torch-native env ids (``jaderl/CartPole-v1``, ``jaderl/StockTrading-v0``)."""

SIMULATORS: dict[str, Callable[[str, int, torch.device | str, int | None, int], VecEnv]] = {
    "vmas/": _vmas, "brax/": _brax, "playground/": _playground, "maniskill/": _maniskill, "pettingzoo/": _pettingzoo}
"""Env id prefixes of the simulators :func:`make_env` builds through an adapter of their own, not through
Gymnasium, and the builder of each: ``builder(name, num_envs, device, seed, workers)``."""

NOT_GYMNASIUM = (JADERL_PREFIX, *SIMULATORS)
"""Prefixes of every env id :func:`make_env` builds without Gymnasium (Atari ids, ``ALE/...``, go through
Gymnasium and ale-py)."""


def make_env(name: str, num_envs: int, device: torch.device | str = "cpu", seed: int | None = None,
             workers: int = 0) -> VecEnv:
    """Build ``num_envs`` copies of env ``name``: a built-in torch env (``jaderl/...``), an Atari game (``ALE/...`` or
    ale-py's older ids such as ``PongNoFrameskip-v4``, preprocessed as in :mod:`jaderl.envs.atari`), a VMAS scenario
    (``vmas/navigation``), a Brax env (``brax/ant``), a MuJoCo Playground env (``playground/CartpoleBalance``), a
    ManiSkill3 task (``maniskill/PushCube-v1``), a PettingZoo parallel env (``pettingzoo/mpe2.simple_spread_v3``), an
    id registered with :func:`register_env` or any Gymnasium id.

    Options after ``?`` (``jaderl/simple_spread?continuous=true&num_agents=4``) go to the constructor of a
    torch-native env (checked against its signature first, see ``_options``) or of a simulator's env; each is given
    once. Atari and other Gymnasium ids take none.

    ``workers > 0`` steps a Gymnasium id in that many worker processes alongside this one, through shared memory
    (:class:`~jaderl.envs.subproc.SubprocVecEnv`); the default steps it in this process. Torch-native and Atari
    envs ignore it."""
    if isinstance(num_envs, bool) or not isinstance(num_envs, numbers.Integral) or num_envs < 1:
        raise EnvError(f"num_envs={num_envs!r} is invalid: give a whole number >= 1 (how many sub-envs to step)")
    num_envs, seed = int(num_envs), None if seed is None else seed_value(seed)
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise EnvError(f"env {name!r} was asked for on device {str(device)!r} but CUDA is not available; use device "
                       "cpu")
    if name in REGISTERED_ENVS:
        return REGISTERED_ENVS[name](num_envs, torch.device(device), seed)
    if is_atari_id(name):
        if "?" in name:
            raise EnvError(f"Atari ids take no ?options ({name!r}): jaderl preprocesses every game the same way "
                           "(jaderl.envs.atari); drop the part after '?'")
        return make_atari_env(name, num_envs, device)
    if is_stock_id(name):  # jaderl/StockTrading-v0, with or without ?KEY=VALUE options (jaderl.envs.stock)
        return StockTradingEnv(num_envs=num_envs, device=device, seed=seed, env_id=name)
    base, _, query = name.partition("?")  # options: jaderl/simple_spread?continuous=true&num_agents=4
    if base in TORCH_ENVS:
        with _options_taken(name):
            return TORCH_ENVS[base](num_envs=num_envs, device=device, seed=seed,
                                    **_options(name, query, TORCH_ENVS[base]))
    if family := next((prefix for prefix in SIMULATORS if name.startswith(prefix)), None):
        return SIMULATORS[family](name, num_envs, device, seed, workers)
    if name.startswith(JADERL_PREFIX):
        raise EnvError(f"unknown env {name!r}; the built-in torch envs are: {', '.join(sorted(TORCH_ENVS))}")
    if query or name.endswith("?"):
        raise EnvError(f"Gymnasium ids take no ?options ({name!r}); drop the part after '?', or register_env a "
                       "factory that builds the env with them (jaderl.envs.register_env)")
    if workers > 0:
        from jaderl.envs.subproc import SubprocVecEnv

        return SubprocVecEnv(name, num_envs, num_workers=workers, device=device)
    return GymnasiumVecEnv(name, num_envs=num_envs, device=device)
