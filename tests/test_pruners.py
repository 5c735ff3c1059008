"""The time-to-accuracy pruner's rules on hand-written curves, and through Optuna's store."""

from __future__ import annotations

import math

import optuna
import pytest

from autotune.pruners import (
    Curve,
    Rules,
    TimeToAccuracyPruner,
    best_tta,
    collapsed,
    could_reach,
    decide,
    interpolate,
    next_evaluation,
    optimistic_tta,
    rungs_crossed,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)
RULES = Rules(target=0.97, chance=0.1, margin=1.0, eta=3.0, min_rung_s=2.0, min_peers=3)


def curve(points, planned_s=None, reached_at=None):
    """``points``: (t, accuracy); progress from a planned length in seconds."""
    planned = planned_s or points[-1][0] * 4
    return Curve(tuple(t for t, _ in points), tuple(v for _, v in points),
                 tuple(min(t / planned, 1.0) for t, _ in points), reached_at)


def test_interpolation_is_linear_between_evaluations_and_flat_after():
    c = curve([(2, 0.2), (4, 0.6)])
    assert interpolate(c, 1) is None
    assert interpolate(c, 3) == pytest.approx(0.4)
    assert interpolate(c, 10) == 0.6


def test_bound_stops_a_trial_past_the_best_tta():
    c = curve([(5, 0.9), (10.5, 0.95)], planned_s=40)
    assert decide(c, [], best_tta=10.0, rules=RULES) == "bound"
    assert decide(c, [], best_tta=15.0, rules=RULES) is None
    assert decide(c, [], best_tta=10.0, rules=Rules(target=0.97, margin=1.5)) is None


def test_bound_stops_a_trial_whose_next_evaluation_comes_after_the_best_tta():
    # A small batch evaluates every 11 s; the best TTA is 15 s. At its first evaluation (11 s,
    # 0.9) the next one cannot come before 11 + 0.5 x 11 = 16.5 s: it cannot win.
    slow = curve([(11, 0.9)], planned_s=44)
    assert next_evaluation(slow, RULES) == pytest.approx(16.5)
    assert decide(slow, [], best_tta=15.0, rules=RULES) == "bound"
    assert decide(slow, [], best_tta=17.0, rules=RULES) is None
    # After the first interval (warm-up included) the pace is the shortest later interval.
    steady = curve([(3, 0.5), (5, 0.8), (7, 0.9)], planned_s=40)
    assert next_evaluation(steady, RULES) == pytest.approx(7 + 0.8 * 2)
    # The end of the planned schedule brings an evaluation, however long the interval.
    ending = curve([(11, 0.95)], planned_s=12)
    assert next_evaluation(ending, RULES) == pytest.approx(12)
    assert decide(ending, [], best_tta=15.0, rules=RULES) is None


def test_no_best_no_bound_and_no_projection():
    c = curve([(5, 0.3), (10, 0.31)], planned_s=200)
    assert decide(c, [], best_tta=None, rules=RULES) is None


def test_projection_stops_a_slow_learner_that_cannot_make_it_in_time():
    # Error 0.7 -> 0.65 in 2 s: even twice as fast, 0.03 is hours away. Planned end is 100 s.
    c = curve([(2, 0.30), (4, 0.35)], planned_s=100)
    assert optimistic_tta(c, RULES) > 20
    assert decide(c, [], best_tta=20.0, rules=RULES) == "projection"


def test_projection_lets_a_fast_learner_continue():
    # Error 0.5 -> 0.2 in 2 s: on that pace it meets 0.03 by about 6 s, before the best (20 s).
    c = curve([(2, 0.5), (4, 0.8)], planned_s=100)
    assert optimistic_tta(c, RULES) < 20
    assert decide(c, [], best_tta=20.0, rules=RULES) is None


def test_projection_waits_for_a_pace_measured_over_time():
    # Two evaluations at the same elapsed time (a trainer that evaluates twice within its
    # clock's resolution, or YAHPO LCBench's surrogate, whose first two epochs often end at
    # the same second): 0.15 -> 0.76 says nothing about the pace, so the projection, which would
    # fall back on the planned end (180 s, past the best TTA), waits for the next evaluation.
    # On LCBench 189906 such runs rose to the target within seconds of it.
    same = Curve((6.92, 6.92), (0.15, 0.76), (1 / 52, 2 / 52))
    target = Rules(target=0.857, chance=0.0)
    assert optimistic_tta(same, target) > 28.8          # the planned end: no pace to go on
    assert decide(same, [], best_tta=28.8, rules=target) is None
    # one evaluation later the pace is measured (0.76 -> 0.82 in 2 s): on it, the trial makes it
    later = Curve((6.92, 6.92, 8.95), (0.15, 0.76, 0.82), (1 / 52, 2 / 52, 3 / 52))
    assert decide(later, [], best_tta=28.8, rules=target) is None
    # ... and had it stalled (0.76 -> 0.765), it could not, and is stopped
    stalled = Curve((6.92, 6.92, 8.95), (0.15, 0.76, 0.765), (1 / 52, 2 / 52, 3 / 52))
    assert decide(stalled, [], best_tta=28.8, rules=target) == "projection"


def test_the_trap_a_long_schedule_behind_early_that_wins_late_survives():
    # Short schedules look good at the 6 s rung; the long one (planned end 16 s) is behind
    # because its LR is still high, but its schedule ends before the best TTA of 18 s: it can
    # still win at the end of its decay, so neither the rung nor the projection stops it.
    short = [curve([(2, 0.6), (4, 0.8), (6, 0.9), (8, 0.95)], planned_s=9) for _ in range(3)]
    long = curve([(2, 0.3), (4, 0.4), (6, 0.5)], planned_s=16)
    assert rungs_crossed(4, 6, RULES) == [6.0]
    assert decide(long, short, best_tta=18.0, rules=RULES) is None
    # The same curve planned far past the best TTA is hopeless: even at twice its steepest
    # pace (error 0.7 -> 0.6 in 2 s) it needs 18 s more; the projection stops it.
    hopeless = curve([(2, 0.3), (4, 0.4), (6, 0.5)], planned_s=120)
    assert decide(hopeless, short, best_tta=18.0, rules=RULES) == "projection"


def test_one_evaluations_dip_does_not_stop_a_trial():
    # Evaluations every 2 s wobble: 0.80 after 0.85 is noise, not a stall. The projection
    # takes the best accuracy so far at the steepest pace shown (0.5 -> 0.7 in 2 s).
    wobbly = curve([(2, 0.5), (4, 0.7), (6, 0.85), (8, 0.80)], planned_s=30)
    assert optimistic_tta(wobbly, RULES) < 14
    assert decide(wobbly, [], best_tta=14.0, rules=RULES) is None


# A recorded quickstart configuration (batch 64, LR 0.092 per 256, 4 epochs, evaluations
# every 2 s) that reached 97% at 34.93 s, the best of its table: at chance for 13.6 s, a
# third of its schedule, then the fastest rise of all.
LATE_RISER = [(2.81, 0.15), (5.32, 0.10), (8.12, 0.10), (10.94, 0.106), (13.60, 0.10),
              (16.16, 0.319), (19.03, 0.367), (21.49, 0.733), (24.03, 0.869), (26.72, 0.933),
              (29.53, 0.936), (32.06, 0.961), (34.93, 0.974)]


def test_a_trial_at_chance_in_its_warm_up_and_its_slow_first_rise_survive():
    # Against the table's second best (38.29 s) and three peers well ahead of it at every
    # rung, no evaluation of the winner's curve before it reaches the target stops it.
    peers = [curve([(2, 0.4), (6, 0.7), (18, 0.9), (30, 0.95)], planned_s=60)
             for _ in range(3)]
    for n in range(1, len(LATE_RISER)):
        seen = curve(LATE_RISER[:n], planned_s=50.7)
        assert decide(seen, peers, best_tta=38.29, rules=RULES) is None, LATE_RISER[n - 1]
    # The same start never rising is judged by the divergence rule at half its schedule.
    flat = curve([(t, 0.1) for t in (5, 10, 15, 20, 25.4)], planned_s=50.7)
    assert decide(flat, peers, best_tta=None, rules=RULES) == "diverged"


def test_rung_stops_the_bottom_of_trials_compared_at_equal_time():
    peers = [curve([(2, v), (6, v + 0.2), (18, v + 0.3)], planned_s=60)
             for v in (0.5, 0.6, 0.55)]
    behind = curve([(2, 0.2), (6.5, 0.3)], planned_s=60)
    ahead = curve([(2, 0.6), (6.5, 0.85)], planned_s=60)
    # No best yet: the bound and the projection are silent; the 6 s rung decides.
    assert decide(behind, peers, best_tta=None, rules=RULES) == "rung"
    assert decide(ahead, peers, best_tta=None, rules=RULES) is None


def test_rung_needs_enough_peers():
    peers = [curve([(2, 0.5), (6, 0.7)], planned_s=60)]
    behind = curve([(2, 0.2), (6.5, 0.3)], planned_s=60)
    assert decide(behind, peers, best_tta=None, rules=RULES) is None


def test_divergence_nan_loss_or_chance_accuracy_after_a_share_of_the_schedule():
    c = curve([(2, 0.5)], planned_s=20)
    assert decide(c, [], None, RULES, loss=math.nan) == "diverged"
    assert decide(c, [], None, RULES, loss=math.inf) == "diverged"
    early_chance = curve([(2, 0.1)], planned_s=20)                 # 10% in: give it time
    assert decide(early_chance, [], None, RULES) is None
    late_chance = curve([(2, 0.1), (11, 0.11)], planned_s=20)      # 55% in, still guessing
    assert decide(late_chance, [], None, RULES) == "diverged"


def test_a_trial_that_cannot_reach_the_target_within_its_own_schedule_stops_before_any_reach():
    # No trial has reached the target yet (no best TTA): 80% through its 20 s schedule at 0.40,
    # rising slowly, it cannot reach 0.97 by its end, even optimistically; it would train to
    # its end and miss.
    flat = curve([(2, 0.30), (4, 0.32), (16, 0.40)], planned_s=20)
    assert decide(flat, [], None, RULES) == "projection"
    # at 0.80 the rest of its schedule (its LR decaying) may bring the 0.17 it lacks
    rising = curve([(2, 0.30), (4, 0.50), (16, 0.80)], planned_s=20)
    assert decide(rising, [], None, RULES) is None
    # a table without planned lengths has no planned end: nothing to judge against
    unplanned = Curve(flat.times, flat.values)
    assert decide(unplanned, [], None, RULES) is None


def test_with_two_classes_a_learning_trial_is_not_at_chance():
    # A binary task (cats and dogs, a scan positive or not): chance is 0.5, and a trial at 0.7
    # halfway through its schedule is learning. Half of chance above it (0.75) would call it
    # diverged; "at chance" is at most 5 points above chance.
    binary = TimeToAccuracyPruner(0.9, num_classes=2).rules
    learning = curve([(2, 0.62), (11, 0.70)], planned_s=20)
    assert decide(learning, [], None, binary) is None
    guessing = curve([(2, 0.5), (11, 0.53)], planned_s=20)
    assert decide(guessing, [], None, binary) == "diverged"
    # ... while 10 and 1,000 classes keep half of chance: 0.15 and 0.0015
    assert RULES.at_chance(0.15) and not RULES.at_chance(0.151)
    imagenet = TimeToAccuracyPruner(0.7, num_classes=1000).rules
    assert imagenet.at_chance(0.0015) and not imagenet.at_chance(0.0016)
    # top-5 of 20 classes guesses 0.25: at chance up to 0.30, not 0.375
    top5 = TimeToAccuracyPruner(0.9, metric="top5", num_classes=20).rules
    assert top5.at_chance(0.30) and not top5.at_chance(0.31)


def test_a_blown_up_loss_at_chance_is_divergence_at_once_and_a_recovering_one_is_not():
    # Recorded on the quickstart (batch 512, LR 1.69 per 256): validation loss 1.1e22 at chance
    # after 21% of its schedule; it never left chance.
    blown = curve([(2.8, 0.1)], planned_s=12.9)
    assert decide(blown, [], None, RULES, loss=1.06e22) == "diverged"
    # A loss of 3.2e4 at chance, then the target at 37.8 s (the per-epoch table): it goes on.
    recovering = curve([(4.8, 0.1)], planned_s=40.1)
    assert decide(recovering, [], None, RULES, loss=3.2e4) is None
    # Above chance the loss alone does not stop it.
    learning = curve([(2.8, 0.4)], planned_s=12.9)
    assert decide(learning, [], None, RULES, loss=1e7) is None


def test_a_slow_start_is_not_divergence():
    # Recorded on the quickstart (batch 256, 11 epochs, 0.7 warm-up epochs): at chance until
    # 36% of its schedule, then 62% at 45% and the target at 27.3 s. Judged diverged at 30%
    # it was failed, and the sampler told to steer away from a configuration that works.
    slow = curve([(2.6, 0.1), (5.0, 0.1), (7.4, 0.1), (9.9, 0.14)], planned_s=27.3)
    assert decide(slow, [], None, RULES) is None
    three_epochs = curve([(7.1, 0.1)], planned_s=21.3)               # one epoch of three
    assert decide(three_epochs, [], None, RULES) is None


def test_best_tta_counts_only_trials_that_reached_the_target():
    study = optuna.create_study()
    for value, outcome in ((4.0, "censored"), (12.0, "reached"), (9.0, "reached")):
        trial = study.ask()
        trial.set_user_attr("outcome", outcome)
        study.tell(trial, value)
    assert best_tta(study.trials) == 9.0


def test_optuna_pruner_decides_from_the_store_alike_in_every_process():
    storage = optuna.storages.InMemoryStorage()
    pruner = TimeToAccuracyPruner(0.97, margin=1.3)
    study = optuna.create_study(storage=storage, pruner=pruner)
    done = study.ask()
    done.set_user_attr("outcome", "reached")
    study.tell(done, 10.0)
    trial = study.ask()
    trial.set_user_attr("curve", [[5.0, 0.9, 1.0, 0.5, 0.3], [10.5, 0.95, 1.0, 0.9, 0.2]])
    trial.set_user_attr("elapsed_s", 10.5)
    assert not trial.should_prune()                         # within the 30% margin
    trial.set_user_attr("curve", [[5.0, 0.9, 1.0, 0.4, 0.3], [13.5, 0.95, 1.0, 0.9, 0.2]])
    assert trial.should_prune()
    other = optuna.load_study(study_name=study.study_name, storage=storage,
                              pruner=TimeToAccuracyPruner(0.97, margin=1.3))
    assert other.pruner.decide(other, other.trials[-1]) == "bound"
    assert other.pruner.deadline(other) == pytest.approx(13.0)


def test_bad_pruner_settings_are_refused():
    with pytest.raises(ValueError, match="margin must be >= 1.0"):
        TimeToAccuracyPruner(0.9, margin=0.5)
    with pytest.raises(ValueError, match="metric must be top1 or top5"):
        TimeToAccuracyPruner(0.9, metric="top3")


# -- before any trial reached: whom a rung loser is judged against (ImageNet-scale curves) ----
IMAGENET = Rules(target=0.70, chance=0.001, eta=3.0, min_rung_s=2.0, min_peers=3)


def _leaders() -> list[Curve]:
    """Three running trials ahead at the 486 s rung, rising slowly (long schedules)."""
    return [curve([(100.0 * k, 0.27 + 0.01 * k + 0.002 * i) for k in range(1, 7)],
                  planned_s=10000.0) for i in range(3)]


def _late_riser() -> Curve:
    """Behind at the rung (0.23 against 0.30), but rising fast since its warm-up ended."""
    return curve([(100.0, 0.002), (200.0, 0.004), (300.0, 0.02), (400.0, 0.1), (500.0, 0.25)],
                 planned_s=8000.0)


def test_a_rung_loser_is_never_stopped_by_another_trials_stop_time():
    stopped_at_chance = Curve((100.0, 200.0, 335.0), (0.001, 0.001, 0.001),
                              (0.01, 0.02, 0.03), running=False)
    riser = _late_riser()
    # its projection (about 750 s) beats what the trials ahead of it can still do
    assert optimistic_tta(riser, IMAGENET) < min(optimistic_tta(o, IMAGENET)
                                                 for o in _leaders())
    assert decide(riser, [*_leaders(), stopped_at_chance], None, IMAGENET) is None
    # the ended trial's stop time (335 s) is no TTA it could show
    assert could_reach(stopped_at_chance, IMAGENET) == math.inf


def test_a_rung_loser_is_stopped_when_the_trials_ahead_of_it_project_sooner():
    slow = curve([(100.0, 0.05), (200.0, 0.06), (300.0, 0.07), (400.0, 0.08), (500.0, 0.09)],
                 planned_s=10000.0)
    fast_leaders = [curve([(100.0 * k, 0.1 * k + 0.01 * i) for k in range(1, 7)],
                          planned_s=2000.0) for i in range(3)]
    assert decide(slow, fast_leaders, None, IMAGENET) == "rung"


def test_a_long_schedule_behind_stopped_fast_starters_that_it_leads_at_equal_share_survives():
    # Short fast starters (planned 2,000 s) lead at the 486 s rung; they were stopped there,
    # and their curves project TTAs near 650 s, before a 10,000 s schedule at 0.15 projects
    # one. Before any trial reached, it goes on: at 5% of their own schedules the starters
    # stood at 0.10 - 0.12, below it, so their projections are no TTA it trails like for like.
    running = [curve([(100.0 * k, 0.1 * k + 0.01 * i) for k in range(1, 7)],
                     planned_s=2000.0) for i in range(3)]
    stopped = [Curve(o.times, o.values, o.progress, running=False) for o in running]
    long = curve([(100.0 * k, 0.03 * k) for k in range(1, 6)], planned_s=10000.0)
    assert optimistic_tta(long, IMAGENET) > max(could_reach(o, IMAGENET) for o in stopped)
    assert decide(long, stopped, None, IMAGENET) is None
    # still running, their optimistic TTAs are theirs to show: it is a rung loser
    assert decide(long, running, None, IMAGENET) == "rung"
    # stopped starters that led it at 5% of their schedules too still count
    ahead = [Curve(o.times, tuple(v + 0.05 for v in o.values), o.progress, running=False)
             for o in running]
    assert decide(long, ahead, None, IMAGENET) == "rung"
    # once a trial has reached, the best TTA is the horizon: at 650 s it cannot win
    assert decide(long, stopped, 650.0, IMAGENET) == "projection"
    # reports without a share of schedule compare at equal time only, as before
    unplanned = Curve(long.times, long.values)
    assert decide(unplanned, [Curve(o.times, o.values, running=False) for o in running], None,
                  IMAGENET) == "rung"


def test_what_an_ended_trial_could_still_reach():
    points = ((100.0, 0.1), (200.0, 0.3), (300.0, 0.4))
    stopped = Curve(tuple(t for t, _ in points), tuple(v for _, v in points),
                    (0.1, 0.2, 0.3), running=False)
    assert stopped.elapsed < could_reach(stopped, IMAGENET) < math.inf   # its projection
    running = Curve(stopped.times, stopped.values, stopped.progress)
    assert could_reach(running, IMAGENET) == optimistic_tta(running, IMAGENET)
    done = Curve(stopped.times, stopped.values, (0.33, 0.67, 1.0), running=False)
    assert could_reach(done, IMAGENET) == math.inf            # ran its whole schedule
    failed = Curve(stopped.times, stopped.values, stopped.progress, running=False, failed=True)
    assert could_reach(failed, IMAGENET) == math.inf
    reached = Curve(stopped.times, (0.5, 0.7, 0.72), stopped.progress, reached_at=200.0,
                    running=False)
    assert could_reach(reached, IMAGENET) == 200.0


def test_one_evaluations_drop_to_chance_at_half_the_schedule_is_not_divergence():
    # a ConvNeXt run at 0.33 top-1 fell to 0.001 for one epoch at half its schedule, and
    # later reached 0.66: the at-chance rule judges its best accuracy so far
    dipped = Curve((100.0, 200.0, 300.0, 400.0), (0.2, 0.33, 0.3, 0.001),
                   (0.125, 0.25, 0.375, 0.5))
    assert decide(dipped, [], None, IMAGENET) is None
    flat = Curve(dipped.times, (0.001, 0.0012, 0.001, 0.001), dipped.progress)
    assert decide(flat, [], None, IMAGENET) == "diverged"


# A DeBERTa-base fine-tuning run on MultiNLI's 3 classes (opda's table, iteration 9, LR 3.1e-4):
# 0.78 after 1,000 steps, then answering one class (the class shares 0.318 - 0.354) for the
# rest of its 9,817 steps, with no loss that blows up.
MNLI = Rules(target=0.88, chance=1 / 3)
COLLAPSE = [(1000, 0.782), (2000, 0.715), (3000, 0.354), (4000, 0.354), (5000, 0.318),
            (6000, 0.318), (7000, 0.327), (8000, 0.354), (9000, 0.318), (9817, 0.327)]


def test_a_run_that_falls_back_to_chance_for_a_tenth_of_its_schedule_diverged():
    def upto(k):
        return curve(COLLAPSE[:k], planned_s=9817.0)
    assert decide(upto(3), [], None, MNLI) is None      # one evaluation at chance: a dip
    assert decide(upto(4), [], None, MNLI) is None      # two
    assert collapsed(upto(5), MNLI) and decide(upto(5), [], None, MNLI) == "diverged"
    # a warm-up still at chance has not collapsed (it never rose); nor has a curve whose
    # reports say nothing of its schedule
    warming = Curve((1000.0, 2000.0, 3000.0, 4000.0), (0.33, 0.34, 0.33, 0.35),
                    (0.1, 0.2, 0.3, 0.4))
    assert not collapsed(warming, MNLI) and decide(warming, [], None, MNLI) is None
    no_schedule = Curve(upto(5).times, upto(5).values)
    assert not collapsed(no_schedule, MNLI)
    # three evaluations at chance within less than a tenth of the schedule: not yet
    quick = Curve((100.0, 200.0, 300.0, 400.0, 500.0), (0.6, 0.7, 0.34, 0.33, 0.34),
                  (0.01, 0.02, 0.03, 0.04, 0.05))
    assert not collapsed(quick, MNLI) and decide(quick, [], None, MNLI) is None
    # the ConvNeXt run that dipped to 0.001 for one epoch at half its schedule goes on (above)


def test_the_pruner_says_whether_a_stored_curve_collapsed():
    pruner = TimeToAccuracyPruner(0.88, num_classes=3)
    rows = [[t, v, None, t / 9817.0, 1.1] for t, v in COLLAPSE]
    assert pruner.collapsed(rows) and not pruner.collapsed(rows[:4])
    assert not TimeToAccuracyPruner(0.88, num_classes=None).collapsed(rows)   # no chance known


def _finished_miss(i: int, planned_s: float) -> Curve:
    """A trial that trained its whole schedule and ended at 0.55, short of 0.70."""
    times = tuple(planned_s * k / 10 for k in range(1, 11))
    values = tuple(0.30 + 0.025 * k + 0.001 * i for k in range(1, 11))
    return Curve(times, values, tuple(k / 10 for k in range(1, 11)), running=False)


def test_a_rung_loser_behind_trials_that_had_its_time_and_missed_is_stopped():
    leaders = [_finished_miss(i, 20000.0) for i in range(3)]
    behind = curve([(1500.0, 0.10), (3000.0, 0.15), (4500.0, 0.20)], planned_s=15000.0)
    assert all(could_reach(o, IMAGENET) == math.inf for o in leaders)
    assert decide(behind, leaders, None, IMAGENET) == "rung"
    # one that plans to train longer than they did may still reach: its LR decays later
    longer = curve([(1500.0, 0.10), (3000.0, 0.15), (4500.0, 0.20)], planned_s=30000.0)
    assert decide(longer, leaders, None, IMAGENET) is None
    # and one still at chance in its warm-up has shown nothing to judge
    warming = curve([(1500.0, 0.001), (3000.0, 0.001), (4500.0, 0.0012)], planned_s=15000.0)
    assert decide(warming, leaders, None, IMAGENET) is None


def ended(points, planned_s, failed=False):
    """A trial that ended at its last point, having done ``t / planned_s`` of its schedule."""
    return Curve(tuple(t for t, _ in points), tuple(v for _, v in points),
                 tuple(min(t / planned_s, 1.0) for t, _ in points), None, running=False,
                 failed=failed)


# A trial that trained its whole 100 s schedule and ended at 0.8, short of 0.97.
MISS = ended([(10, 0.3), (20, 0.45), (30, 0.55), (50, 0.68), (100, 0.8)], planned_s=100)


def test_a_trial_retracing_a_known_miss_is_stopped():
    # The same schedule, at or below the miss at each of its three evaluations (30% of it):
    # it trains the same curve again (a sampler's near-repeat) and would end at 0.8 too.
    again = curve([(10, 0.3), (20, 0.44), (30, 0.55)], planned_s=100)
    assert decide(again, [MISS], best_tta=None, rules=RULES) == "follows_miss"
    # Ahead of the miss at one evaluation: it is not retracing it.
    ahead = curve([(10, 0.3), (20, 0.47), (30, 0.55)], planned_s=100)
    assert decide(ahead, [MISS], best_tta=None, rules=RULES) is None
    # Planned 30% longer: its LR decays later, so the miss says nothing of its end.
    longer = curve([(10, 0.3), (20, 0.44), (30, 0.55)], planned_s=130)
    assert decide(longer, [MISS], best_tta=None, rules=RULES) is None


def test_only_a_whole_schedule_that_missed_is_a_known_miss():
    again = curve([(10, 0.3), (20, 0.44), (30, 0.55)], planned_s=100)
    stopped = ended([(10, 0.3), (20, 0.45), (30, 0.55)], planned_s=100)    # a pruner's stop
    failed = ended([(10, 0.3), (20, 0.45), (30, 0.55), (100, 0.8)], 100, failed=True)
    running = curve([(10, 0.3), (20, 0.45), (30, 0.55), (100, 0.8)], planned_s=100)
    for other in (stopped, failed, running):
        assert decide(again, [other], best_tta=None, rules=RULES) is None


def test_a_retrace_is_judged_only_after_enough_of_it():
    two = curve([(10, 0.3), (20, 0.44)], planned_s=100)
    assert decide(two, [MISS], best_tta=None, rules=RULES) is None
    long_miss = ended([(10, 0.3), (20, 0.45), (30, 0.55), (400, 0.9)], planned_s=400)
    early = curve([(10, 0.3), (20, 0.44), (30, 0.55)], planned_s=400)     # 7.5% of it
    assert decide(early, [long_miss], best_tta=None, rules=RULES) is None
    assert decide(early, [long_miss], best_tta=None,
                  rules=Rules(target=0.97, follow_share=0.05)) == "follows_miss"
    # Still at chance in its warm-up: nothing shown to compare.
    flat_miss = ended([(10, 0.1), (20, 0.1), (30, 0.12), (100, 0.8)], planned_s=100)
    warming = curve([(10, 0.1), (20, 0.1), (30, 0.11)], planned_s=100)
    assert decide(warming, [flat_miss], best_tta=None, rules=RULES) is None


def test_the_optuna_pruner_stops_a_repeat_of_a_stored_miss():
    # As the worker stores them: a trial that trained its whole schedule and missed (censored,
    # +inf, its curve's last row at progress 1.0), then a repeat of its configuration.
    study = optuna.create_study(pruner=TimeToAccuracyPruner(0.97))
    rows = [[10.0, 0.3, 0.6, 0.1, 2.0], [20.0, 0.45, 0.7, 0.2, 1.5], [30.0, 0.55, 0.8, 0.3, 1.2],
            [100.0, 0.8, 0.9, 1.0, 0.7]]
    missed = study.ask()
    missed.set_user_attr("outcome", "censored")
    missed.set_user_attr("stop_reason", "planned_epochs")
    missed.set_user_attr("curve", rows)
    study.tell(missed, math.inf)
    repeat = study.ask()
    repeat.set_user_attr("curve", rows[:2])
    assert study.pruner.decide(study, study.trials[-1]) is None      # two evaluations
    repeat.set_user_attr("curve", rows[:3])
    assert study.pruner.decide(study, study.trials[-1]) == "follows_miss"


# -- a target on a metric that falls (mode min: a loss, WER, perplexity) -----------------------
def _falling(points, planned_s):
    """A curve of a falling metric as the pruner holds it: negated."""
    c = curve(points, planned_s=planned_s)
    return Curve(c.times, tuple(-v for v in c.values), c.progress)


def test_a_falling_metric_is_projected_on_its_log_as_an_error_is():
    # a loss 2.0 -> 1.6 -> 1.2 toward 0.3 projects exactly as an accuracy whose error is the
    # loss over any scale: log-linear paces do not depend on the unit (end rule out of reach)
    loss = [(10.0, 2.0), (20.0, 1.6), (30.0, 1.2)]
    falls = Rules(target=-0.3, chance=-math.inf, falls=True)
    for scale in (2.5, 10.0):
        accuracy = Rules(target=1 - 0.3 / scale, chance=0.0)
        as_error = curve([(t, 1 - v / scale) for t, v in loss], planned_s=1e6)
        assert optimistic_tta(_falling(loss, 1e6), falls) == pytest.approx(
            optimistic_tta(as_error, accuracy))
    # a loss that is not falling fast enough for the best TTA is stopped; a fast one goes on
    assert decide(_falling(loss, 1e6), [], best_tta=40.0, rules=falls) == "projection"
    fast = [(10.0, 2.0), (20.0, 0.8), (30.0, 0.45)]
    assert decide(_falling(fast, 1e6), [], best_tta=40.0, rules=falls) is None


def test_a_falling_metric_has_no_chance_level_and_its_end_allowance_is_relative():
    falls = Rules(target=-0.3, chance=-math.inf, falls=True)
    # flat at 5.0 for 80% of its schedule: no divergence rule reads a loss as "at chance"
    flat = _falling([(t, 5.0) for t in (10.0, 20.0, 30.0, 40.0)], planned_s=50.0)
    assert decide(flat, [], best_tta=None, rules=falls) != "diverged"
    # at 60% of its schedule, 0.41 against 0.3 having started at 0.43: its pace alone would
    # take it to 159 s, but the gap is a quarter of its own start, within what the rest of a
    # schedule brings (sqrt(0.4)), so its planned end (100 s) counts; in any unit alike (the
    # same loss x 10 is 1.1 from its target, an accuracy's whole range)
    for unit in (1.0, 10.0):
        near = _falling([(30.0, 0.43 * unit), (45.0, 0.42 * unit), (60.0, 0.41 * unit)],
                        planned_s=100.0)
        rules = Rules(target=-0.3 * unit, chance=-math.inf, falls=True)
        assert optimistic_tta(near, rules) == pytest.approx(100.0)
        slow = Rules(target=-0.3 * unit, chance=-math.inf, falls=True, end_gain=0.2)
        assert optimistic_tta(near, slow) > 150.0
    # ... and the pruner reads stored rows (the loss in top-1's place) negated
    pruner = TimeToAccuracyPruner(0.3, metric="top1", num_classes=None, falls=True)
    assert pruner.rules.target == -0.3 and pruner.rules.falls
    assert not pruner.rules.at_chance(-5.0)
    with pytest.raises(ValueError, match="a target that falls must be above 0"):
        TimeToAccuracyPruner(0.0, falls=True)


def test_a_near_miss_is_no_known_miss():
    """A fine-tuning run that crept to 0.889 at its end, short of 0.891 by less than its last
    evaluations wobbled (0.886, 0.889, 0.887, 0.889): the goal run, a near-repeat of it, sits
    at or below it early and passes the target by that wobble at its end. Retracing it is no
    sign of missing; retracing a run that fell short by more than it wobbled still is."""
    rules = Rules(target=0.891, chance=1 / 3)
    near = ended([(1000, 0.80), (2000, 0.86), (3000, 0.874), (4000, 0.886), (5000, 0.889),
                  (6000, 0.887), (7000, 0.889)], planned_s=7000)
    again = curve([(1000, 0.79), (2000, 0.855), (3000, 0.872)], planned_s=7000)
    assert decide(again, [near], best_tta=None, rules=rules) is None
    def lower(c, by=0.02):
        return [(t, v - by) for t, v in zip(c.times, c.values, strict=True)]
    far = ended(lower(near), planned_s=7000)
    assert decide(curve(lower(again), planned_s=7000), [far], best_tta=None,
                  rules=rules) == "follows_miss"
