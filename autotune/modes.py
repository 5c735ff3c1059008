"""How a study proposes and stops trials, chosen by the study file's ``pruner``.

* ``tta``: autotune's own (``ExploringTPESampler`` and the ``TimeToAccuracyPruner``); a
  trial that missed is told as +inf with a constraint (``decisions.tell_result``);
* ``median`` and ``none``, for comparisons: plain TPE with Optuna's MedianPruner or no pruning,
  told with Optuna's usual conventions (``decisions.tell_optuna_style``).

Every choice that depends on the mode is made here, from the one ``Mode`` a name stands for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:                 # the config reads the names without importing Optuna
    import optuna

    from .config import StudyConfig

__all__ = ["MODES", "Mode", "make_pruner", "make_sampler", "mode_of"]


def _tta_pruner(cfg: StudyConfig) -> optuna.pruners.BasePruner:
    from .decisions import metric_slot
    from .pruners import TimeToAccuracyPruner

    metric = cfg.target.metric      # a script's own metric: its chance level is not known
    return TimeToAccuracyPruner(cfg.target.value, metric=metric_slot(metric),
                                num_classes=cfg.trainer.num_classes if metric in (
                                    "top1", "top5") else None, margin=cfg.pruner_margin,
                                falls=cfg.target.falls)


def _median_pruner(cfg: StudyConfig) -> optuna.pruners.BasePruner:
    import optuna

    return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1)


def _no_pruner(cfg: StudyConfig) -> optuna.pruners.BasePruner:
    import optuna

    return optuna.pruners.NopPruner()


def _exploring_sampler(cfg: StudyConfig, seed: int | None) -> optuna.samplers.BaseSampler:
    from .decisions import metric_slot
    from .samplers import ExploringTPESampler, accuracy_target

    return ExploringTPESampler(seed=seed,
                               target=accuracy_target(cfg.target.value, cfg.target.falls),
                               metric=metric_slot(cfg.target.metric))


def _tpe_sampler(cfg: StudyConfig, seed: int | None) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)


@dataclass(frozen=True)
class Mode:
    name: str
    about: str
    pruner: Callable[[StudyConfig], optuna.pruners.BasePruner]
    sampler: Callable[[StudyConfig, int | None], optuna.samplers.BaseSampler]
    tells_constraints: bool       # autotune's way of telling outcomes (decisions.tell)


MODES = {m.name: m for m in (
    Mode("tta", "autotune's sampler and time-to-accuracy pruner", _tta_pruner,
         _exploring_sampler, True),
    Mode("median", "TPE with Optuna's MedianPruner (for comparisons)", _median_pruner,
         _tpe_sampler, False),
    Mode("none", "TPE without pruning (for comparisons)", _no_pruner, _tpe_sampler, False),
)}


def mode_of(cfg: StudyConfig) -> Mode:
    """The study's mode (the config was validated: its ``pruner`` names one)."""
    return MODES[cfg.pruner]


def make_pruner(cfg: StudyConfig) -> optuna.pruners.BasePruner:
    """The study's pruner."""
    return mode_of(cfg).pruner(cfg)


def make_sampler(cfg: StudyConfig, seed: int | None) -> optuna.samplers.BaseSampler:
    """The study's sampler. ``seed`` seeds this process's draws (a worker passes None and draws
    its own: its spread points keep away from every other worker's trials through the study
    store)."""
    return mode_of(cfg).sampler(cfg, seed)
