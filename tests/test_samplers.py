"""autotune's sampler: spread points, TPE for a share after the start, workers kept apart."""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from types import SimpleNamespace

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from autotune._spread import distance, draw, farthest, nearby_cost
from autotune.samplers import ExploringTPESampler, SpreadSampler, pace_need, planned_seconds

optuna.logging.set_verbosity(optuna.logging.ERROR)

SPACE = {"x": FloatDistribution(0.0, 1.0), "lr": FloatDistribution(0.01, 2.0, log=True)}


def _draw(trial: optuna.Trial) -> tuple[float, float]:
    return trial.suggest_float("x", 0.0, 1.0), trial.suggest_float("lr", 0.01, 2.0, log=True)


def _run(study: optuna.Study, n: int) -> list[tuple[float, float]]:
    points = []
    for _ in range(n):
        trial = study.ask()
        x, lr = _draw(trial)
        points.append((x, lr))
        study.tell(trial, (x - 0.3) ** 2 + math.log(lr) ** 2)
    return points


def _closest_pair(points: list[tuple[float, float]]) -> float:
    as_dicts = [{"x": x, "lr": lr} for x, lr in points]
    return min(distance(SPACE, a, b) for i, a in enumerate(as_dicts) for b in as_dicts[:i])


def test_distance_is_taken_in_the_unit_cube_of_the_space():
    space = {**SPACE, "decay": CategoricalDistribution(["cosine", "step"]),
             "epochs": IntDistribution(3, 13)}
    a = {"x": 0.0, "lr": 0.01, "decay": "cosine", "epochs": 3}
    assert distance(space, a, a) == 0.0
    assert distance(space, a, {**a, "x": 0.5}) == pytest.approx(0.5)
    assert distance(space, a, {**a, "lr": 2.0}) == pytest.approx(1.0)           # log range
    assert distance(space, a, {**a, "lr": math.sqrt(0.02)}) == pytest.approx(0.5)
    assert distance(space, a, {**a, "decay": "step"}) == 1.0
    assert distance(space, a, {**a, "epochs": 8}) == pytest.approx(0.5)
    assert distance(space, a, {"x": 1.0}) == 1.0     # a parameter one point lacks: not counted


def test_draws_stay_in_range_on_the_step_grid():
    rng = random.Random(0)
    stepped = FloatDistribution(0.0, 1.0, step=0.25)
    ints = IntDistribution(4, 9)
    for _ in range(200):
        assert draw(stepped, rng) in (0.0, 0.25, 0.5, 0.75, 1.0)
        value = draw(ints, rng)
        assert isinstance(value, int) and 4 <= value <= 9
        assert 0.01 <= draw(SPACE["lr"], rng) <= 2.0


def test_an_integer_ranges_ends_are_drawn_half_as_often_as_the_values_between():
    # Deliberate (BENCHMARKS.md): greedy maximin prefers a range's ends, so the draw does not
    # give them a whole bin each; 1 - 4 epochs: 1 and 4 one draw in six, 2 and 3 one in three.
    rng = random.Random(1)
    counts = Counter(draw(IntDistribution(1, 4), rng) for _ in range(60_000))
    assert set(counts) == {1, 2, 3, 4}
    for value, share in ((1, 1 / 6), (2, 1 / 3), (3, 1 / 3), (4, 1 / 6)):
        assert counts[value] / 60_000 == pytest.approx(share, abs=0.01), counts


def test_the_farthest_candidate_is_kept():
    tried = [{"x": 0.1, "lr": 0.01}, {"x": 0.9, "lr": 2.0}]
    rng = random.Random(1)
    point = farthest(SPACE, tried, rng, candidates=64)
    # the emptiest corners are (0, 2.0) and (1, 0.01), each sqrt(0.82) from the tried points
    gap = min(distance(SPACE, point, t) for t in tried)
    assert gap > 0.75
    assert farthest(SPACE, [], random.Random(1), 64) == farthest(SPACE, [], random.Random(1), 1)


def test_nearby_cost_is_the_geometric_mean_of_the_nearest_known_costs():
    assert nearby_cost([0.1, 0.2, 0.3, 0.9], [4.0, None, 16.0, 1000.0], 2) == pytest.approx(8.0)
    assert nearby_cost([0.5], [7.0], 3) == pytest.approx(7.0)        # fewer than asked: those
    assert nearby_cost([0.1, 0.2], [None, None], 3) is None


LINE = {"x": FloatDistribution(0.0, 1.0)}


def test_of_two_equally_empty_regions_the_one_among_cheap_trials_wins():
    # Tried: x = 0 (a 100 s schedule) and x = 1 (a 1 s one); the emptiest points are around
    # x = 0.5 on either side. Plain maximin picks a side by chance; weighed by cost, the
    # candidate kept is on the cheap side every time.
    tried, costs = [{"x": 0.0}, {"x": 1.0}], [100.0, 1.0]
    weighed = [farthest(LINE, tried, random.Random(s), 16, costs=costs, cost_weight=1.0,
                        neighbours=1)["x"] for s in range(20)]
    plain = [farthest(LINE, tried, random.Random(s), 16)["x"] for s in range(20)]
    assert min(weighed) > 0.5
    assert 0 < sum(x > 0.5 for x in plain) < 20
    assert farthest(LINE, tried, random.Random(3), 16, costs=costs, cost_weight=0.0) == \
        farthest(LINE, tried, random.Random(3), 16)                  # weight 0: plain maximin
    with pytest.raises(ValueError, match="1 costs for 2 tried points"):
        farthest(LINE, tried, random.Random(0), 4, costs=[1.0], cost_weight=1.0)


def _trial_with_curve(x: float, curve: list[list[float]],
                      outcome: str) -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(params={"x": x}, distributions=LINE, value=curve[-1][0],
                                     user_attrs={"curve": curve, "outcome": outcome})


def test_a_trials_planned_duration_comes_from_its_last_evaluation():
    # rows: [elapsed_s, top1, top5, progress, loss]; a quarter of the schedule in 10 s
    assert planned_seconds(_trial_with_curve(0.5, [[4.0, 0.2, 0.6, 0.1, 2.0],
                                                   [10.0, 0.5, 0.9, 0.25, 1.0]],
                                             "censored")) == pytest.approx(40.0)
    assert planned_seconds(_trial_with_curve(0.5, [[3.0, 0.1, 0.5, 0.0, 2.0]], "failed")) is None
    assert planned_seconds(optuna.trial.create_trial(params={"x": 0.5}, distributions=LINE,
                                                     value=1.0)) is None
    # a study on top-5 whose evaluations hold no top-1: the schedule is as long
    assert planned_seconds(_trial_with_curve(0.5, [[4.0, None, 0.6, 0.1, 2.0],
                                                   [10.0, None, 0.9, 0.25, 1.0]],
                                             "censored")) == pytest.approx(40.0)


def test_a_failed_neighbour_counts_failed_cost_times_its_duration():
    # x = 0 diverged after a 10 s schedule's first evaluation; x = 1 ran a 20 s schedule. At
    # face value the diverged side is the cheaper; counted 4 x (40 s) it is the dearer.
    def next_x(failed_cost: float, seed: int) -> float:
        study = optuna.create_study(sampler=SpreadSampler(seed=seed, candidates=16,
                                                          cost_weight=1.0, neighbours=1,
                                                          failed_cost=failed_cost))
        study.add_trial(_trial_with_curve(0.0, [[1.0, 0.1, 0.5, 0.1, 1e9]], "failed"))
        study.add_trial(_trial_with_curve(1.0, [[20.0, 0.9, 1.0, 1.0, 0.3]], "censored"))
        trial = study.ask()
        return trial.suggest_float("x", 0.0, 1.0)

    assert all(next_x(4.0, seed) > 0.5 for seed in range(10))
    assert all(next_x(1.0, seed) < 0.5 for seed in range(10))


def test_a_trial_failed_before_its_first_evaluation_counts_as_a_dear_one():
    # x = 0 ran out of memory at its first step (no curve to plan from); x = 1 ran a 20 s
    # schedule. The failed one counts 4 x the median known duration (80 s), so the next point
    # goes to x = 1's side every time; were it not counted, either side would do.
    def tried() -> optuna.Study:
        study = optuna.create_study()
        study.add_trial(optuna.trial.create_trial(params={"x": 0.0}, distributions=LINE,
                                                  value=0.0, user_attrs={"outcome": "failed"}))
        study.add_trial(_trial_with_curve(1.0, [[20.0, 0.9, 1.0, 1.0, 0.3]], "censored"))
        return study

    assert SpreadSampler(failed_cost=4.0)._costs(tried().trials) == pytest.approx([80.0, 20.0])
    for seed in range(10):
        study = tried()
        study.sampler = SpreadSampler(seed=seed, candidates=32, cost_weight=1.0, neighbours=1)
        assert study.ask().suggest_float("x", 0.0, 1.0) > 0.5


def test_a_miss_needs_the_time_its_average_pace_would_take_to_the_target():
    # 0.6 after 10 s: log(0.3) / log(0.4) x 10 s = 13.1 s to reach 0.7; 0.3: 33.8 s
    near = _trial_with_curve(0.5, [[5.0, 0.5, 0.8, 0.5, 1.0], [10.0, 0.6, 0.9, 1.0, 0.8]],
                             "censored")
    far = _trial_with_curve(0.5, [[5.0, 0.2, 0.4, 0.5, 2.0], [10.0, 0.3, 0.5, 1.0, 1.8]],
                            "censored")
    assert pace_need(near, 0.7) == pytest.approx(10 * math.log(0.3) / math.log(0.4))
    assert pace_need(far, 0.7) == pytest.approx(10 * math.log(0.3) / math.log(0.7))
    assert pace_need(near, 0.55) is None                            # it got there
    assert pace_need(near, 0.95, metric="top5") == pytest.approx(
        10 * math.log(0.05) / math.log(0.1))                        # top-5's slot
    at_zero = _trial_with_curve(0.5, [[10.0, 0.0, 0.0, 0.5, 7.0]], "censored")
    assert pace_need(at_zero, 0.7) == math.inf
    assert pace_need(optuna.trial.create_trial(params={"x": 0.5}, distributions=LINE,
                                               value=1.0), 0.7) is None


def test_a_neighbour_that_ran_out_far_below_the_target_counts_as_a_dear_one():
    # x = 0 ran a 10 s schedule to its end and stopped at 0.3; x = 1 ran a 20 s one to 0.68.
    # By planned duration x = 0's side is the cheaper; by the pace each would need to reach
    # 0.7 (33.8 s, capped at 4 x 10 s; 21 s) x = 1's is.
    def tried(target: float | None) -> tuple[optuna.Study, SpreadSampler]:
        sampler = SpreadSampler(seed=0, candidates=32, cost_weight=1.0, neighbours=1,
                                target=target)
        study = optuna.create_study(sampler=sampler)
        study.add_trial(_trial_with_curve(0.0, [[5.0, 0.2, 0.5, 0.5, 2.0],
                                                [10.0, 0.3, 0.6, 1.0, 1.8]], "censored"))
        study.add_trial(_trial_with_curve(1.0, [[10.0, 0.6, 0.9, 0.5, 1.0],
                                                [20.0, 0.68, 0.95, 1.0, 0.8]], "censored"))
        return study, sampler

    study, sampler = tried(0.7)
    far, near = sampler._costs(study.trials)
    assert far == pytest.approx(10 * math.log(0.3) / math.log(0.7))
    assert near == pytest.approx(20 * math.log(0.3) / math.log(0.32))
    study, sampler = tried(0.7)
    sampler.failed_cost = 2.0
    assert sampler._costs(study.trials)[0] == pytest.approx(20.0)      # at most 2 x 10 s
    study, sampler = tried(None)
    assert sampler._costs(study.trials) == pytest.approx([10.0, 20.0])  # no target: planned
    for seed in range(10):
        study, sampler = tried(0.7)
        sampler._rng = random.Random(seed)
        assert study.ask().suggest_float("x", 0.0, 1.0) > 0.5
        study, sampler = tried(None)
        sampler._rng = random.Random(seed)
        assert study.ask().suggest_float("x", 0.0, 1.0) < 0.5


def test_reached_running_failed_and_interrupted_trials_are_not_weighed_by_pace():
    sampler = SpreadSampler(target=0.7, failed_cost=4.0)
    reached = _trial_with_curve(0.0, [[10.0, 0.75, 0.9, 0.5, 1.0]], "reached")
    failed = _trial_with_curve(0.5, [[10.0, 0.1, 0.3, 0.5, 1e9]], "failed")
    running = optuna.trial.create_trial(params={"x": 1.0}, distributions=LINE,
                                        state=optuna.trial.TrialState.RUNNING,
                                        user_attrs={"curve": [[10.0, 0.1, 0.3, 0.5, 2.0]]})
    interrupted = optuna.trial.create_trial(
        params={"x": 0.2}, distributions=LINE, value=1.0,
        user_attrs={"curve": [[10.0, 0.1, 0.3, 0.5, 2.0]], "outcome": "censored",
                    "stop_reason": "interrupted"})      # resumed elsewhere: no miss
    assert sampler._costs([reached, failed, running, interrupted]) == \
        pytest.approx([10.0, 80.0, 20.0, 20.0])     # reached: its TTA (its value here)


def test_a_trial_that_reached_counts_its_tta_not_its_whole_schedule():
    # x = 0 planned 100 s and reached at 12 s; x = 1 planned 30 s and reached at its end.
    # By planned duration x = 1's side is the cheaper; by what reaching took, x = 0's is.
    def study_of(tta_early: float) -> tuple[optuna.Study, SpreadSampler]:
        sampler = SpreadSampler(seed=0, candidates=32, cost_weight=1.0, neighbours=1,
                                target=0.7)
        study = optuna.create_study(sampler=sampler)
        study.add_trial(optuna.trial.create_trial(
            params={"x": 0.0}, distributions=LINE, value=tta_early,
            user_attrs={"curve": [[12.0, 0.72, 0.9, 0.12, 1.0]], "outcome": "reached",
                        "tta_s": tta_early}))
        study.add_trial(_trial_with_curve(1.0, [[15.0, 0.5, 0.8, 0.5, 1.0],
                                                [30.0, 0.71, 0.9, 1.0, 0.8]], "reached"))
        return study, sampler

    study, sampler = study_of(12.0)
    assert sampler._costs(study.trials) == pytest.approx([12.0, 30.0])
    for seed in range(10):
        study, sampler = study_of(12.0)
        sampler._rng = random.Random(seed)
        assert study.ask().suggest_float("x", 0.0, 1.0) < 0.5
    # a TTA on another clock than the curve's (launch included), longer than the schedule:
    # the planned duration stands
    study, sampler = study_of(150.0)
    assert sampler._costs(study.trials) == pytest.approx([100.0, 30.0])
    no_curve = optuna.trial.create_trial(params={"x": 0.5}, distributions=LINE, value=7.0,
                                         user_attrs={"outcome": "reached"})
    assert sampler._costs([no_curve]) == pytest.approx([7.0])          # only a TTA known


def test_a_target_off_the_accuracy_scale_is_refused():
    for target in (0.0, 1.0, 25.0, -0.5):
        with pytest.raises(ValueError, match="between 0 and 1"):
            SpreadSampler(target=target)
    with pytest.raises(ValueError, match="top1 or top5"):
        ExploringTPESampler(target=0.7, metric="f1")


def test_which_sampler_draws_each_trial():
    sampler = ExploringTPESampler(seed=1, n_startup_trials=4, tpe_every=3)
    study = optuna.create_study(sampler=sampler)
    kinds = []
    for number in range(12):
        trial = SimpleNamespace(number=number)  # the choice reads the number alone
        kinds.append("tpe" if sampler._for(study, trial) is sampler._tpe else "spread")
    assert kinds == ["spread"] * 5 + ["tpe", "spread", "spread", "tpe", "spread", "spread", "tpe"]


def test_spread_points_keep_apart_where_random_ones_crowd():
    # 16 points in two dimensions, ten seeds: no two spread points come closer than 0.1 (of
    # the unit square), and their closest pair is typically twice as far apart as random
    # draws' (random draws put two points within 0.05 in half the seeds).
    spread, scattered = [], []
    for seed in range(10):
        spread.append(_closest_pair(_run(optuna.create_study(sampler=SpreadSampler(seed=seed)),
                                         16)))
        scattered.append(_closest_pair(_run(optuna.create_study(
            sampler=optuna.samplers.RandomSampler(seed=seed)), 16)))
    assert min(spread) > 0.1
    assert statistics.median(spread) > 2 * statistics.median(scattered)


def test_workers_spread_apart_through_the_study_store(tmp_path):
    """Two workers with the same draws (the worst case: the same seed) on one stored study,
    each asking for a trial while the other's runs: the second keeps away from the first's
    running trial instead of drawing the same point."""
    url = f"sqlite:///{tmp_path}/shared.db"
    history = optuna.create_study(study_name="s", storage=url,
                                  sampler=optuna.samplers.RandomSampler(seed=0))
    _run(history, 3)
    finished = history.trials
    workers = [optuna.load_study(study_name="s", storage=url,
                                 sampler=ExploringTPESampler(seed=5)) for _ in range(2)]
    first = workers[0].ask()
    a = dict(zip(("x", "lr"), _draw(first), strict=True))   # running, its parameters stored
    second = workers[1].ask()
    b = dict(zip(("x", "lr"), _draw(second), strict=True))
    assert distance(SPACE, a, b) > 0.2
    # the same draws with the first trial finished elsewhere unseen: the very same point
    again = optuna.create_study(sampler=ExploringTPESampler(seed=5))
    for trial in finished:
        again.add_trial(trial)
    assert dict(zip(("x", "lr"), _run(again, 1)[0], strict=True)) == pytest.approx(a)


def test_tpe_takes_over_its_share_after_the_start():
    study = optuna.create_study(sampler=ExploringTPESampler(seed=0, n_startup_trials=8,
                                                            tpe_every=2))
    values = [(x - 0.3) ** 2 + math.log(lr) ** 2 for x, lr in _run(study, 40)]
    # TPE's trials (odd numbers from 8 on) gather near the optimum (x = 0.3, lr = 1.0);
    # the spread trials keep covering the space.
    tpe = sorted(v for n, v in enumerate(values) if n >= 20 and n % 2 == 1)
    spread = sorted(v for n, v in enumerate(values) if n >= 20 and n % 2 == 0)
    assert tpe[5] < 0.25 * spread[5]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="tpe_every"):
        ExploringTPESampler(tpe_every=-1)
    with pytest.raises(ValueError, match="n_startup_trials"):
        ExploringTPESampler(n_startup_trials=-1)
    with pytest.raises(ValueError, match="candidates"):
        SpreadSampler(candidates=0)
    with pytest.raises(ValueError, match="cost_weight"):
        SpreadSampler(cost_weight=-0.5)
    with pytest.raises(ValueError, match="failed_cost"):
        ExploringTPESampler(failed_cost=0.0)
    with pytest.raises(ValueError, match="neighbours"):
        SpreadSampler(neighbours=0)
    with pytest.raises(ValueError, match="local_half_width"):
        ExploringTPESampler(local_half_width=0.0)


def _batch_study(noise_scales: list[float],
                 sampler: optuna.samplers.BaseSampler | None = None) -> optuna.Study:
    """A study whose finished trials measured these noise scales (one each, batch 16)."""
    study = optuna.create_study(direction="minimize", sampler=sampler or SpreadSampler(seed=3))
    space = {"global_batch": CategoricalDistribution([16, 32, 64, 128, 256, 512]),
             "lr": FloatDistribution(0.01, 1.0, log=True)}
    for i, scale in enumerate(noise_scales):
        trial = optuna.trial.create_trial(
            params={"global_batch": 16, "lr": 0.01 * (i + 1)}, distributions=space,
            value=float(i + 1), user_attrs={"noise_scale": scale, "outcome": "reached"})
        study.add_trial(trial)
    return study


def _batches(study: optuna.Study, n: int) -> list[int]:
    found = []
    for _ in range(n):
        trial = study.ask()
        found.append(trial.suggest_categorical("global_batch", [16, 32, 64, 128, 256, 512]))
        trial.suggest_float("lr", 0.01, 1.0, log=True)
        study.tell(trial, 1.0)
    return found


def test_a_study_keeps_its_batches_within_the_factor_of_the_measured_noise_scale():
    from autotune.samplers import BATCH_FACTOR, batch_cap

    capped = _batches(_batch_study([4.0, 6.0, 8.0]), 20)     # cap: 8 x 8 = 64 images
    assert BATCH_FACTOR == 8.0 and batch_cap(_batch_study([4.0, 6.0, 8.0]).trials) == 64.0
    assert max(capped) <= 64 and len(set(capped)) > 1
    # fewer than three measurements: no cap, the whole range is explored
    free = _batches(_batch_study([4.0, 6.0]), 20)
    assert max(free) > 64
    # a cap below every batch keeps the smallest
    assert set(_batches(_batch_study([0.5, 0.5, 1.0]), 5)) == {16}


def test_tpes_proposals_are_held_to_the_noise_scale_cap_too():
    from autotune.samplers import within_cap

    # TPE proposes every trial here; its history's best trial sits at the largest batch
    tpe_only = ExploringTPESampler(seed=5, n_startup_trials=0, tpe_every=1,
                                   local_half_width=None)
    study = _batch_study([4.0, 6.0, 8.0], tpe_only)        # cap: 64 images
    study.add_trial(optuna.trial.create_trial(
        params={"global_batch": 512, "lr": 0.1}, value=0.1,
        distributions={"global_batch": CategoricalDistribution([16, 32, 64, 128, 256, 512]),
                       "lr": FloatDistribution(0.01, 1.0, log=True)}))
    found = _batches(study, 16)
    assert max(found) <= 64 and 64 in found
    free = _batches(_batch_study([4.0, 6.0], ExploringTPESampler(
        seed=5, n_startup_trials=0, tpe_every=1, local_half_width=None)), 16)
    assert max(free) > 64
    # points near the fastest configuration (batch 16 here) are held to the cap as well,
    # even where that configuration's own batch lies above it
    near = ExploringTPESampler(seed=5, n_startup_trials=0, tpe_every=4)
    study = _batch_study([4.0, 6.0, 8.0], near)
    study.add_trial(optuna.trial.create_trial(
        params={"global_batch": 512, "lr": 0.1}, value=0.5, user_attrs={"outcome": "reached"},
        distributions={"global_batch": CategoricalDistribution([16, 32, 64, 128, 256, 512]),
                       "lr": FloatDistribution(0.01, 1.0, log=True)}))
    assert max(_batches(study, 16)) <= 64
    # the rule itself, on each kind of distribution
    assert within_cap("global_batch", 300, IntDistribution(16, 1024, step=16), 100.0) == 96
    assert within_cap("global_batch", 300.0, FloatDistribution(16, 1024), 100.0) == 100.0
    assert within_cap("global_batch", 48, IntDistribution(16, 1024), 100.0) == 48
    assert within_cap("lr", 5.0, FloatDistribution(0.01, 10.0), 1.0) == 5.0
    assert within_cap("global_batch", 512, CategoricalDistribution([256, 512]), 100.0) == 256


def test_only_trials_that_trained_to_the_end_set_the_cap():
    """A trial stopped early measured early training's noise scale, which grows later."""
    from autotune.samplers import batch_cap

    def trial(scale: float, **attrs: str) -> optuna.trial.FrozenTrial:
        return optuna.trial.create_trial(
            params={"lr": 0.1}, distributions={"lr": FloatDistribution(0.01, 1.0)}, value=1.0,
            user_attrs={"noise_scale": scale, **attrs})

    early = [trial(5.0, outcome="censored", stop_reason="projection") for _ in range(3)]
    assert batch_cap(early) is None
    ended = [trial(4.0, outcome="reached", stop_reason="reached"),
             trial(6.0, outcome="censored", stop_reason="planned_epochs"),
             trial(3.0, outcome="reached", stop_reason="reached")]
    assert batch_cap(early + ended) == 48.0          # 8 x 6, the stopped trials' 5s left out
    assert batch_cap([*early, *ended[:2]]) is None   # two that trained to the end: no cap yet


def test_trials_another_client_added_do_not_stop_the_spread():
    """A trial told to the study by another client, with no parameters or others
    (`study.add_trial` with a value of its own), emptied the space the spread points are
    drawn in and sat at distance 0 from every draw: each start of the study (a new sampler
    with the same seed) then proposed the same point again. Now such trials are left out, and
    a second start keeps away from the first one's proposal."""
    study = optuna.create_study(sampler=SpreadSampler(seed=3))
    _run(study, 6)
    study.add_trial(optuna.trial.create_trial(value=0.5))
    study.add_trial(optuna.trial.create_trial(
        params={"y": 1.0}, distributions={"y": FloatDistribution(0, 2)}, value=0.1))
    firsts = []
    for _ in range(2):                     # two starts of the study, each with seed 3
        study.sampler = SpreadSampler(seed=3)
        assert study.sampler.infer_relative_search_space(study, study.trials[0]) == SPACE
        firsts.append(dict(zip(("x", "lr"), _run(study, 1)[0], strict=True)))
    assert distance(SPACE, *firsts) > 0.1


def test_a_draw_near_a_point_stays_in_its_box_on_the_grid_and_keeps_its_choice():
    from autotune._spread import draw_near, unit

    rng = random.Random(0)
    lr, epochs = FloatDistribution(0.005, 50.0, log=True), IntDistribution(20, 100)
    batch = CategoricalDistribution([128, 256, 512, 1024])
    for _ in range(500):
        v = draw_near(lr, 0.1, 0.2, rng)
        assert abs(unit(lr, v) - unit(lr, 0.1)) <= 0.2 + 1e-9
        e = draw_near(epochs, 95, 0.25, rng)       # the box clipped at the range's end
        assert isinstance(e, int) and 75 <= e <= 100
        assert draw_near(batch, 1024, 0.4, rng) == 1024
    assert {draw_near(batch, 1024, 0.5, rng) for _ in range(200)} == {128, 256, 512, 1024}


def test_after_a_first_reach_one_spread_point_in_four_is_drawn_near_the_fastest_one():
    from optuna.trial import create_trial

    from autotune import record
    from autotune._spread import unit
    from autotune.samplers import incumbent

    dists = {"x": FloatDistribution(0.0, 1.0), "lr": FloatDistribution(0.01, 2.0, log=True),
             "batch": CategoricalDistribution([64, 128, 256])}
    rng = random.Random(3)

    def finished(params: dict, tta: float | None) -> optuna.trial.FrozenTrial:
        return create_trial(params=params, distributions=dists, value=tta or 1e6,
                            user_attrs={record.OUTCOME: "reached" if tta else "censored"})

    tried = [finished({"x": rng.random(), "lr": 0.01 * 200 ** rng.random(),
                       "batch": rng.choice([64, 128, 256])}, None) for _ in range(6)]
    assert incumbent(tried) is None
    fastest = {"x": 0.8, "lr": 1.5, "batch": 256}
    tried += [finished({"x": 0.2, "lr": 0.05, "batch": 64}, 30.0), finished(fastest, 20.0)]
    assert incumbent(tried) == fastest
    sampler = ExploringTPESampler(seed=0, n_startup_trials=8, tpe_every=4)
    study = optuna.create_study(sampler=sampler)
    for t in tried:
        study.add_trial(t)
    near = []
    for number in range(8, 24):
        trial = study.ask()
        params = {"x": trial.suggest_float("x", 0.0, 1.0),
                  "lr": trial.suggest_float("lr", 0.01, 2.0, log=True),
                  "batch": trial.suggest_categorical("batch", [64, 128, 256])}
        study.tell(trial, 1e6)
        if number % 4 == 1:
            near.append(params)
    assert len(near) == 4
    for p in near:
        assert p["batch"] == 256
        for name in ("x", "lr"):
            assert abs(unit(dists[name], p[name]) - unit(dists[name], fastest[name])) <= 0.4
    # TPE keeps its one in four; a sampler told not to draws no local points
    assert sampler._for(study, SimpleNamespace(number=11)) is sampler._tpe
    plain = ExploringTPESampler(seed=0, n_startup_trials=8, tpe_every=4, local_half_width=None)
    study = optuna.create_study(sampler=plain)
    for t in tried:
        study.add_trial(t)
    plain._for(study, SimpleNamespace(number=9))
    assert plain._centers.get(9) is None and sampler._centers.get(9) == fastest


def test_a_study_weighs_misses_against_its_own_accuracy_target():
    import dataclasses

    from autotune.config import StudyConfig, Target
    from autotune.modes import make_sampler

    def spread(target: Target) -> SpreadSampler:
        sampler = make_sampler(dataclasses.replace(StudyConfig(), target=target), 0)
        assert isinstance(sampler, ExploringTPESampler)
        return sampler._spread

    assert (spread(Target("top1", 0.93)).target, spread(Target("top1", 0.93)).metric) == \
        (0.93, "top1")
    assert spread(Target("top5", 0.93)).metric == "top5"
    assert spread(Target("f1", 0.8)).metric == "top1"         # a script's metric: top-1's slot
    assert spread(Target("top1", 1.0)).target is None         # no error left to weigh by
    assert spread(Target("loss", 0.9, mode="min")).target is None
    assert spread(Target("bleu", 25.0)).target is None
