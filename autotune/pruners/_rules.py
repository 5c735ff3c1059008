"""The pruning rules, as pure functions of curves and the best time-to-accuracy.

The curves hold the target metric with higher better: an accuracy as it is, a metric that
falls to its target (a loss, ``Rules.falls``) negated, its target too.

Each rule answers one question about a running trial and returns a stop reason or None:

* ``diverged``: the loss is NaN or infinite; or accuracy is at chance with a validation loss
  past ``blowup_loss`` (the weights have blown up: logits millions apart); or the best accuracy
  so far is still at chance after a set share of the planned schedule (one evaluation's dip to
  chance after a rise is not divergence); or it rose above chance and then fell back to it
  for its last ``collapse_evals`` evaluations, over ``collapse_share`` of its schedule (the
  model collapsed to answering one class, as too high a learning rate leaves it, without a
  loss that blows up);
* ``bound``: its elapsed time has passed the best TTA (times a margin), or its next
  evaluation cannot come before it: it cannot win (TTA is taken at an evaluation);
* ``projection``: even an optimistic projection of its TTA (its best accuracy so far, at the
  steepest pace it has shown, or its planned end where the rest of the schedule may bring
  the gap) is later than the best TTA, or later than its own planned end (it cannot reach
  the target within its schedule, whether or not any trial has reached it yet); judged once
  it has shown a pace: two evaluations at different elapsed times (two at the same second
  say nothing of it);
* ``rung``: at wall-clock rungs (``min_rung_s`` x eta^k seconds) it is in the bottom
  1 - 1/eta of the trials that got there, compared at equal elapsed time, as ASHA does
  asynchronously, unless its projection says it can still win (a long schedule that is behind
  early and wins late survives). Before any trial has reached the target, an ended peer
  ahead of it at the rung counts only if it was also ahead at the same share of its own
  schedule (a long schedule still at a high LR is compared with where a stopped short one
  stood as far into its own schedule, not at equal time alone; without shares in the
  reports, at equal time), and "can still win" is judged against the peers ahead that can
  still reach: running ones at
  their optimistic TTA, ended ones only where their curves project a TTA past their end. A
  trial that ended (stopped, diverged, or done with its schedule) never lends its stop time as
  a TTA. When none of the peers ahead of it can still reach, and some of them trained their
  whole schedule without reaching, each planned at least as long as its own, it is stopped:
  it is behind trials that had all its time and missed (unless it is still at chance in its
  warm-up);
* ``follows_miss``: an ended trial with the same planned time (within ``same_end``) trained its
  whole schedule and missed the target, and this trial has been at or below that trial's
  curve at every evaluation so far (at least ``follow_evals``, and ``follow_share`` of its
  schedule): it is retracing a known miss (a sampler's near-repeat of a tried configuration
  trains the same curve again), so it is stopped instead of training to the same end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ._curves import Curve, interpolate

__all__ = ["Rules", "collapsed", "could_reach", "decide", "follows_a_miss",
           "next_evaluation", "optimistic_tta", "rungs_crossed"]


@dataclass(frozen=True)
class Rules:
    target: float                 # the accuracy to reach
    chance: float = 0.1           # accuracy of guessing (1/classes for top-1, 5/classes top-5)
    margin: float = 1.0           # bound and projection stop past margin x best TTA
    eta: float = 3.0              # rung spacing and reduction factor
    min_rung_s: float = 2.0       # first rung, in elapsed seconds
    min_peers: int = 3            # trials needed at a rung before it decides anything
    diverge_after: float = 0.5    # share of the schedule after which chance accuracy diverged
    blowup_loss: float = 1e6      # validation loss (mean cross-entropy) that, at chance, diverged
    optimism: float = 2.0         # projection assumes progress this much faster than observed
    end_gain: float = 1.0         # accuracy the rest of a schedule can add: end_gain x sqrt(left)
    first_pace: float = 0.5       # the next evaluation: at least this share of the first interval
    pace: float = 0.8             # ... or of the shortest interval after the first
    same_end: float = 0.1         # follows_miss: planned ends this close (share) count as alike
    follow_evals: int = 3         # ... judged after this many evaluations
    follow_share: float = 0.1     # ... and this share of the schedule
    collapse_evals: int = 3       # diverged: back at chance for this many evaluations in a row
    collapse_share: float = 0.1   # ... spanning this share of the schedule
    chance_band: float = 0.05     # "at chance": up to half of chance above it, at most this
    falls: bool = False           # the metric falls to its target (a loss): every value, the
                                  # target and chance (-inf: none) are given negated

    def error(self, value: float) -> float:
        """How far ``value`` is from perfect, on the scale whose log the projection follows:
        an accuracy's error (1 - value); a falling metric itself (given negated: -value);
        at least 1e-6."""
        return max(-value if self.falls else 1.0 - value, 1e-6)

    def end_gap(self, top: float, curve: Curve) -> float:
        """The gap from the best value so far to the target, in the unit the end-of-schedule
        allowance is set in: an accuracy's share (its error spans at most 1); a falling
        metric's share of the worst value the trial has shown (its own starting error)."""
        if not self.falls:
            return self.target - top
        worst = -min((v for v in curve.values if math.isfinite(v)), default=0.0)
        return (self.target - top) / worst if worst > 0 else 0.0

    def at_chance(self, value: float) -> bool:
        """Whether accuracy ``value`` is no better than guessing: at most half of chance above
        it (0.15 for 10 classes, 0.0015 for 1,000), and never more than ``chance_band`` above
        it, so a binary classifier at 0.7 (chance 0.5) is learning, not guessing."""
        return value <= self.chance + min(0.5 * self.chance, self.chance_band)


def optimistic_tta(curve: Curve, rules: Rules) -> float:
    """The earliest time this trial could plausibly reach the target.

    Judged on its best accuracy so far (one evaluation's dip says nothing: with evaluations
    every 2 s, accuracy wobbles), two ways to get there: its error keeps falling at the
    steepest pace it has shown between two evaluations (log error linear in time, ``optimism``
    times faster), or the end of its planned schedule, where the LR has decayed, brings the
    rest (plausible when the gap left is at most ``end_gain x sqrt(share of schedule left)``).

    A trial still at chance before ``diverge_after`` of its schedule has shown nothing to
    project from: it could take off at any moment (a warm-up at a high LR often looks so for a
    third of the schedule, then rises fast to win). Its earliest TTA is now; the bound and the
    divergence rule judge it.
    """
    if curve.reached_at is not None:
        return curve.reached_at
    if not curve.times:
        return math.inf
    now = curve.times[-1]
    running, top = [], (-math.inf if rules.falls else 0.0)
    for value in curve.values:
        top = max(top, value)
        running.append(top)
    if top >= rules.target:
        return now
    progress = curve.progress[-1] if curve.progress else 0.0
    if rules.at_chance(top) and progress < rules.diverge_after:
        return now
    best = math.inf
    if progress > 0 and rules.end_gap(top, curve) <= rules.end_gain * math.sqrt(
            max(1 - progress, 0)):
        best = curve.planned_end()
    steepest = 0.0           # d log(error) / dt, most negative between two evaluations
    for (t0, v0), (t1, v1) in zip(zip(curve.times, running, strict=True),
                                  zip(curve.times[1:], running[1:], strict=True), strict=False):
        if t1 > t0:
            steepest = min(steepest, (math.log(rules.error(v1)) -
                                      math.log(rules.error(v0))) / (t1 - t0))
    if steepest < 0:
        gap = math.log(rules.error(rules.target)) - math.log(rules.error(top))
        best = min(best, now + gap / (steepest * rules.optimism))
    return best


def next_evaluation(curve: Curve, rules: Rules) -> float:
    """The earliest elapsed time of the trial's next evaluation.

    Evaluations come at a steady pace (every epoch, k steps or s seconds), and one always
    comes at the end of the planned schedule. The pace may quicken (the first interval holds
    the warm-up: up to twice the later ones, measured), so the next one is assumed
    ``first_pace`` of the first interval away, or ``pace`` of the shortest later one."""
    if not curve.times:
        return 0.0
    gaps = [b - a for a, b in zip((0.0, *curve.times), curve.times, strict=False)]
    step = rules.pace * min(gaps[1:]) if len(gaps) > 1 else rules.first_pace * gaps[0]
    return min(curve.elapsed + max(step, 0.0), max(curve.planned_end(), curve.elapsed))


def rungs_crossed(before: float, now: float, rules: Rules) -> list[float]:
    """Rung times in (before, now]."""
    found, t = [], rules.min_rung_s
    while t <= now:
        if t > before:
            found.append(t)
        t *= rules.eta
    return found


def _rung_leaders(curve: Curve, others: Sequence[Curve], rules: Rules) -> list[Curve] | None:
    """At a rung crossed since the trial's last evaluation where it is in the bottom
    1 - 1/eta of the trials that got there: the peers ahead of it there. None: no rung it
    crossed puts it at the bottom."""
    before = curve.times[-2] if len(curve.times) >= 2 else 0.0
    for t in rungs_crossed(before, curve.elapsed, rules):
        mine = interpolate(curve, t)
        there = [(o, interpolate(o, t)) for o in others
                 if o.elapsed >= t or o.reached_at is not None]
        peers = [(o, v) for o, v in there if v is not None]
        if mine is None or len(peers) < rules.min_peers:
            continue
        ranked = sorted([*(v for _, v in peers), mine], reverse=True)
        keep = max(1, math.floor(len(ranked) / rules.eta))
        if mine < ranked[keep - 1]:
            return [o for o, v in peers if v > mine]
    return None


def _ended_ones_ahead_at_equal_share(curve: Curve, leaders: Sequence[Curve]) -> list[Curve]:
    """The rung leaders that count before any trial reached: running ones, and ended ones only
    where they were also ahead of ``curve`` as far into their own schedules as it is now (their
    value where their curve stood at ``curve``'s share of schedule done above ``curve``'s
    latest value). An ended trial's projection past its stop is a TTA no trial will show; a
    short schedule that started fast and was stopped lends it against a long one still at a
    high LR, which trails at equal time by design, only if it led like for like. Without
    shares in the reports (no schedule known) every leader stays."""
    share = curve.progress[-1] if curve.progress else 0.0
    if share <= 0.0:
        return list(leaders)
    mine = curve.values[-1]
    kept = []
    for other in leaders:
        if other.running:
            kept.append(other)          # its optimistic TTA is still to be shown
            continue
        if not other.progress or other.progress[-1] < share:
            continue                    # it ended before it got that far into its schedule
        there = interpolate(Curve(other.progress, other.values), share)
        if there is not None and there > mine:
            kept.append(other)
    return kept


def _warming_at_chance(curve: Curve, rules: Rules) -> bool:
    """Still at chance before ``diverge_after`` of its schedule: a warm-up that has shown
    nothing to judge yet."""
    progress = curve.progress[-1] if curve.progress else 0.0
    return rules.at_chance(curve.best) and progress < rules.diverge_after


def collapsed(curve: Curve, rules: Rules) -> bool:
    """It rose above chance, then its accuracy fell back to chance and stayed there for its
    last ``collapse_evals`` evaluations, spanning ``collapse_share`` of its schedule (from the
    reports' share done: a table or trainer without it never collapses). One evaluation's
    dip to chance is noise; a model that answers one class for a tenth of its schedule has
    lost what it learnt."""
    n = rules.collapse_evals
    if len(curve.values) <= n or not curve.progress or rules.at_chance(curve.best):
        return False
    if not all(rules.at_chance(v) for v in curve.values[-n:]):
        return False
    return curve.progress[-1] - curve.progress[-n] >= rules.collapse_share


def _trained_whole_schedule(curve: Curve) -> bool:
    """Ended on its own at the end of its planned schedule (not stopped, not failed)."""
    return (not curve.running and not curve.failed and bool(curve.progress)
            and curve.progress[-1] >= 1.0)


def _behind_finished_misses(curve: Curve, leaders: Sequence[Curve], rules: Rules) -> bool:
    """No trial ahead of ``curve`` at its rung can still reach the target, and some of them
    trained their whole schedule without reaching it, each planned at least as long as this
    one: it is behind trials that had all its time and missed. (One that plans to train
    longer than all of them may yet reach: its LR decays later; and one still at chance in
    its warm-up has shown nothing to judge.)"""
    done = [o.elapsed for o in leaders if _trained_whole_schedule(o)]
    if not done or _warming_at_chance(curve, rules):
        return False
    return curve.planned_end() <= min(done)


def _clear_miss(miss: Curve, rules: Rules) -> bool:
    """A run that missed by more than its curve's own wobble at its end: the largest fall
    between two of its last ``follow_evals`` + 1 evaluations (a rise is its trend; a fall,
    its evaluations' noise, which a near-repeat of it may have the other way)."""
    last = miss.values[-(rules.follow_evals + 1):]
    wobble = max((a - b for a, b in zip(last, last[1:], strict=False)), default=0.0)
    return rules.target - miss.best > wobble


def follows_a_miss(curve: Curve, others: Sequence[Curve], rules: Rules) -> bool:
    """Some ended trial planned as long in time as this one (``same_end``) trained its whole
    schedule without reaching the target, and this trial's accuracy has been at or below that
    trial's (at equal elapsed time) at each of its evaluations, at least ``follow_evals`` of
    them over ``follow_share`` of its schedule. A trial still at chance in its warm-up has
    shown nothing to compare. A near miss does not count (``_clear_miss``): a run that ended
    within its own last evaluations' wobble of the target is one a retracing trial may pass
    by that wobble alone (at a table's top, the goal run and its near misses look alike)."""
    progress = curve.progress[-1] if curve.progress else 0.0
    if (len(curve.times) < rules.follow_evals or progress < rules.follow_share
            or _warming_at_chance(curve, rules)):
        return False
    end = curve.planned_end()
    for miss in others:
        if (not _trained_whole_schedule(miss) or miss.reached_at is not None
                or miss.best >= rules.target or not _clear_miss(miss, rules)
                or abs(end - miss.elapsed) > rules.same_end * miss.elapsed):
            continue
        alongside = [interpolate(miss, t) for t in curve.times]
        if all(w is not None and v <= w
               for v, w in zip(curve.values, alongside, strict=True)):
            return True
    return False


def could_reach(curve: Curve, rules: Rules) -> float:
    """The earliest TTA a trial can still show: its TTA once reached; a running trial's
    optimistic TTA; for one that ended without reaching, the TTA its curve projects past its
    end (infinite where it failed, ran its whole schedule, or projects nothing later than its
    stop: its stop time is no TTA)."""
    if curve.reached_at is not None:
        return curve.reached_at
    projected = optimistic_tta(curve, rules)
    if curve.running:
        return projected
    done = bool(curve.progress) and curve.progress[-1] >= 1.0
    if curve.failed or done or projected <= curve.elapsed:
        return math.inf
    return projected


def decide(curve: Curve, others: Sequence[Curve], best_tta: float | None, rules: Rules,
           loss: float | None = None) -> str | None:
    """The reason to stop this trial now, or None to let it go on."""
    if loss is not None and not math.isfinite(loss):
        return "diverged"
    at_chance = bool(curve.values) and rules.at_chance(curve.values[-1])
    # A loss past blowup_loss at chance: no recorded trial that came back from one reached the
    # target (the highest loss any reaching trial showed was 3.2e4; BENCHMARKS.md).
    if at_chance and loss is not None and loss > rules.blowup_loss:
        return "diverged"
    progress = curve.progress[-1] if curve.progress else 0.0
    never_left_chance = bool(curve.values) and rules.at_chance(curve.best)
    if never_left_chance and progress >= rules.diverge_after:
        return "diverged"
    if collapsed(curve, rules):
        return "diverged"
    if curve.reached_at is not None or not curve.times:
        return None
    deadline = None if best_tta is None else best_tta * rules.margin
    if deadline is not None and (curve.elapsed > deadline
                                 or next_evaluation(curve, rules) > deadline):
        return "bound"
    projected = optimistic_tta(curve, rules)
    # No TTA comes after a schedule's end: its planned end bounds it as the best TTA does, so
    # a trial that cannot reach the target within its own schedule stops before any trial
    # has reached it too.
    horizon = min(math.inf if deadline is None else deadline, curve.planned_end())
    if projected > horizon and len(set(curve.times)) >= 2:
        return "projection"
    leaders = _rung_leaders(curve, others, rules)
    if leaders is not None and deadline is None:
        # Before any trial reached, an ended peer ahead at equal time counts only if it was
        # ahead at an equal share of its own schedule too: a long schedule behind short fast
        # starters that were stopped is not culled against their projections unless they
        # led it like for like.
        leaders = _ended_ones_ahead_at_equal_share(curve, leaders) or None
    if leaders is not None:
        # The trap: a long schedule is behind early and wins late. It survives while its
        # optimistic TTA beats the best TTA, or, before any trial reached the target, what
        # the peers ahead of it at the rung can still do.
        reachable = min((could_reach(o, rules) for o in leaders), default=math.inf)
        if reachable == math.inf and _behind_finished_misses(curve, leaders, rules):
            return "rung"
        horizon = deadline if deadline is not None else reachable
        if projected > horizon:
            return "rung"
    if follows_a_miss(curve, others, rules):
        return "follows_miss"
    return None
