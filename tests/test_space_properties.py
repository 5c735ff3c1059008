"""Properties of every search space: JSON round trips; sampled points obey the constraints."""

from __future__ import annotations

import json

import optuna
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune import (
    Categorical,
    Constraint,
    Derived,
    Fixed,
    Float,
    InfeasiblePoint,
    Int,
    PowerOfTwo,
    SearchSpace,
)
from autotune._expr import Expr
from autotune.space import load_space

optuna.logging.set_verbosity(optuna.logging.WARNING)
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def params(draw: st.DrawFn, name: str) -> object:
    kind = draw(st.sampled_from(["float", "logfloat", "int", "pow2", "cat", "fixed"]))
    if kind == "float":
        low = draw(finite)
        return Float(name, low, low + draw(st.floats(min_value=1e-3, max_value=1e3)))
    if kind == "logfloat":
        low = draw(st.floats(min_value=1e-6, max_value=1e3))
        return Float(name, low, low * draw(st.floats(min_value=1.01, max_value=1e3)), log=True)
    if kind == "int":
        low = draw(st.integers(-100, 100))
        step = draw(st.integers(1, 5))
        return Int(name, low, low + step * draw(st.integers(1, 20)), step=step)
    if kind == "pow2":
        low = draw(st.integers(0, 8))
        return PowerOfTwo(name, 1 << low, 1 << (low + draw(st.integers(1, 6))))
    if kind == "cat":
        choices = draw(st.lists(st.one_of(st.integers(-5, 5), st.sampled_from(["a", "b", "c"]),
                                          st.booleans()), min_size=1, max_size=4,
                                unique_by=repr))
        return Categorical(name, choices)
    return Fixed(name, draw(st.one_of(st.integers(), st.text(max_size=5), st.none())))


@st.composite
def spaces(draw: st.DrawFn) -> SearchSpace:
    n = draw(st.integers(1, 5))
    items: list = [draw(params(f"p{i}")) for i in range(n)]
    numeric = [p for p in items if isinstance(p, (Float, Int, PowerOfTwo))]
    if numeric and draw(st.booleans()):
        p = numeric[0]
        items.append(Derived("d0", f"{p.name} * 2"))
        mid = (p.low + p.high) / 2
        items.append(Constraint(f"{p.name} <= {mid!r} or d0 > {p.high * 2!r}"))
    if len(numeric) >= 2 and draw(st.booleans()):
        a, b = numeric[:2]
        items.append(Categorical("switch", ["x", "y"]))
        items.append(Float("cond", 0.0, 1.0, condition=f"switch == 'x' and {a.name} >= {a.low}"))
    return SearchSpace(*items, world_size=1)


@FAST
@given(spaces())
def test_json_round_trip_is_lossless_and_samples_the_same(space):
    again = SearchSpace.from_dict(json.loads(json.dumps(space.to_dict())))
    assert again.to_dict() == space.to_dict()
    for seed in (0, 1):
        assert _points(space, seed) == _points(again, seed)


def _points(space: SearchSpace, seed: int, n: int = 8) -> list:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    out = []
    for _ in range(n):
        trial = study.ask()
        try:
            out.append(space.sample(trial))
            study.tell(trial, 0.0)
        except InfeasiblePoint as e:
            out.append(("infeasible", e.constraint))
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
    return out


def _satisfies(space: SearchSpace, point: dict) -> bool:
    env = {"world_size": space.world_size, **point}
    return all(Expr(c.expr)(env) is True for c in space.constraints)


@FAST
@given(spaces(), st.integers(0, 1000))
def test_every_sampled_point_satisfies_the_constraints(space, seed):
    for point in _points(space, seed):
        if isinstance(point, dict):
            assert _satisfies(space, point)
            for p in space.params:
                if p.name in point:
                    assert p.contains(point[p.name])


@settings(max_examples=10, deadline=None)
@given(st.sampled_from(["quickstart", "resnet50_imagenet_dawnbench", "resnet50_imagenet_mlperf"]),
       st.sampled_from([1, 2, 8, 64, 256]), st.integers(0, 1000))
def test_shipped_spaces_only_yield_feasible_splittable_points(name, world_size, seed):
    space = load_space(name, world_size=world_size)
    for point in _points(space, seed, n=20):
        if isinstance(point, dict):
            assert _satisfies(space, point)
            assert point["global_batch"] % world_size == 0
