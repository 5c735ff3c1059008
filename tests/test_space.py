"""The search-space API: sampling, conditions, derived values, constraints, JSON, loading."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from autotune import (
    Categorical,
    Constraint,
    DataInfo,
    Derived,
    Fixed,
    Float,
    InfeasiblePoint,
    Int,
    PowerOfTwo,
    SearchSpace,
    SpaceError,
)
from autotune.space import check_space, load_space, shipped_spaces

optuna.logging.set_verbosity(optuna.logging.WARNING)
ROOT = Path(__file__).resolve().parent.parent


def large_batch_space(world_size: int = 8) -> SearchSpace:
    return SearchSpace(
        PowerOfTwo("global_batch", 256, 32768),
        Categorical("optimizer", ["sgd", "lars"]),
        Float("lars_trust_coefficient", 1e-4, 1e-2, log=True, condition="optimizer == 'lars'"),
        Float("lr_per_256", 0.01, 2, log=True),
        Int("epochs", 16, 90),
        Derived("warmup_epochs", "min(0.3 * epochs, 2 + global_batch / 4096)"),
        Fixed("momentum", 0.9),
        Constraint("optimizer == 'lars' or global_batch <= 8192"),
        warm_starts=[{"global_batch": 8192, "optimizer": "sgd", "lr_per_256": 0.1,
                      "epochs": 90, "momentum": 0.9}],
        world_size=world_size)


def sample_many(space: SearchSpace, n: int = 60, seed: int = 1) -> list[dict]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    points = []
    for _ in range(n):
        trial = study.ask()
        try:
            points.append(space.sample(trial))
        except InfeasiblePoint:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        study.tell(trial, 0.0)
    return points


def test_conditional_parameters_exist_only_where_their_condition_holds():
    points = sample_many(large_batch_space())
    assert {p["optimizer"] for p in points} == {"sgd", "lars"}
    for p in points:
        assert ("lars_trust_coefficient" in p) == (p["optimizer"] == "lars")


def test_derived_values_follow_the_batch_and_constraints_hold():
    points = sample_many(large_batch_space())
    assert points
    for p in points:
        assert p["warmup_epochs"] == pytest.approx(min(0.3 * p["epochs"],
                                                       2 + p["global_batch"] / 4096))
        assert p["optimizer"] == "lars" or p["global_batch"] <= 8192
        assert p["momentum"] == 0.9


def test_a_violating_point_raises_infeasible_with_the_constraint():
    space = large_batch_space()
    study = optuna.create_study()
    study.enqueue_trial({"global_batch_log2": 15, "optimizer": "sgd", "lr_per_256": 0.1,
                         "epochs": 30})
    with pytest.raises(InfeasiblePoint, match="optimizer == 'lars' or global_batch <= 8192"):
        space.sample(study.ask())


def test_warm_starts_enqueue_as_the_exact_point():
    space = large_batch_space()
    study = optuna.create_study()
    study.enqueue_trial(space.encode(space.warm_starts[0]))
    point = space.sample(study.ask())
    assert {k: point[k] for k in space.warm_starts[0]} == space.warm_starts[0]
    assert point["warmup_epochs"] == pytest.approx(4.0)


def test_define_by_run_adds_parameters():
    def extra(trial, values):
        return {"weight_decay": trial.suggest_float("weight_decay", 1e-5, 1e-3, log=True)}

    space = SearchSpace(Int("epochs", 2, 4), define_by_run=extra)
    point = sample_many(space, n=1)[0]
    assert set(point) == {"epochs", "weight_decay"}


def test_round_trips_through_json():
    space = large_batch_space()
    again = SearchSpace.from_dict(json.loads(json.dumps(space.to_dict())))
    assert again.to_dict() == space.to_dict()
    assert again.table() == space.table()


def test_table_shows_conditions_derived_values_and_constraints():
    text = large_batch_space().table()
    assert "lars_trust_coefficient" in text and "if optimizer == 'lars'" in text
    assert "= min(0.3 * epochs" in text
    assert "constraint: optimizer == 'lars' or global_batch <= 8192" in text
    assert "world size 8" in text


def test_all_problems_are_collected_at_build():
    with pytest.raises(SpaceError) as info:
        SearchSpace(Float("a", 2, 1), Int("b", 0, 8, log=True), Categorical("c", []))
    assert len(info.value.problems) == 3
    assert "and 2 more problem(s)" in str(info.value)


@pytest.mark.parametrize("name", ["images", "quickstart", "resnet50_imagenet_dawnbench",
                                  "resnet50_imagenet_mlperf"])
@pytest.mark.parametrize("world_size", [1, 2, 8, 24, 128])
def test_shipped_spaces_build_for_any_world_size(name, world_size):
    space = load_space(name, world_size=world_size)
    points = sample_many(space, n=20)
    assert all(p["global_batch"] % world_size == 0 for p in points)
    assert space.warm_starts


def test_imagenet_warm_starts_are_the_published_recipes_moved_to_the_world_size():
    space = load_space("resnet50_imagenet_dawnbench", world_size=128)
    lars_32k = [w for w in space.warm_starts if w["warmup_epochs"] == 14.0][0]   # AIACC
    assert lars_32k["optimizer"] == "lars" and lars_32k["global_batch"] == 32768
    assert lars_32k["lr_per_256"] * 32768 / 256 == pytest.approx(25.0)
    goyal = [w for w in space.warm_starts if w["epochs"] == 90][0]
    assert goyal["global_batch"] == 8192 and goyal["lr_per_256"] == 0.1
    assert goyal["decay"] == "step" and goyal["res_start"] == goyal["res_end"] == 224
    seed = [w for w in space.warm_starts if w["epochs"] == 43][0]     # MoXing, 28,672 -> 32k
    assert seed["global_batch"] == 32768 and seed["optimizer"] == "lars"
    assert (seed["res_start"], seed["res_mid"], seed["res_end"]) == (128, 224, 288)
    small = load_space("resnet50_imagenet_mlperf", world_size=8)
    mlperf = [w for w in small.warm_starts if w.get("decay") == "poly"][0]
    assert mlperf["global_batch"] == 4096                         # 3,200 moved to 8 x 512
    assert mlperf["lr_per_256"] * 3200 / 256 == pytest.approx(11.0)


def test_shipped_space_names():
    assert set(shipped_spaces()) == {"images", "quickstart", "resnet50_imagenet_dawnbench",
                                     "resnet50_imagenet_mlperf"}


@pytest.mark.parametrize("world_size", [1, 2, 3, 8, 24])
@pytest.mark.parametrize("images", [6, 12, 40, 300, 1437, 10_000, 1_281_167])
def test_the_images_space_sizes_its_batches_from_the_data_and_the_ranks(world_size, images):
    data = DataInfo(train_images=images, num_classes=10, image_size=32)
    space = load_space("images", world_size=world_size, data=data)
    batches = space.params[0].values()
    assert all(b % world_size == 0 for b in batches)
    assert min(batches) >= min(16, world_size) or min(batches) == world_size
    if images >= world_size:    # a tree of fewer images than 16 still trains: they fit a batch
        assert max(batches) <= images
    # an epoch keeps at least 32 steps at the largest batch, unless the ranks forbid it
    assert max(batches) <= max(images // 32, world_size, 16)
    assert max(batches) <= 1024 or max(batches) == world_size
    assert [w["augment"] for w in space.warm_starts] == ["none", "crop_flip"]
    assert space.warm_starts[0]["global_batch"] in batches
    assert not check_space(space)


def test_a_space_function_may_take_the_data(tmp_path):
    (tmp_path / "sized.py").write_text(
        "from autotune import Int, PowerOfTwo, Float, SearchSpace\n"
        "def space(world_size, data):\n"
        "    top = 16 if data is None else data.train_images // 10\n"
        "    return SearchSpace(PowerOfTwo('global_batch', 2, top), Float('lr_per_256', 0.1, 1),"
        " Int('epochs', 1, 2), world_size=world_size)\n")
    unknown = load_space(str(tmp_path / "sized.py"), world_size=2)
    assert unknown.params[0].values()[-1] == 16
    sized = load_space(str(tmp_path / "sized.py"), world_size=2,
                       data=DataInfo(train_images=640, num_classes=3, image_size=8))
    assert sized.params[0].values()[-1] == 64


def test_a_file_without_space_says_what_to_define(tmp_path):
    (tmp_path / "empty.py").write_text("x = 1\n")
    with pytest.raises(SpaceError, match="must define `space`"):
        load_space(str(tmp_path / "empty.py"))


def test_the_readme_example_is_a_valid_space(tmp_path):
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Writing a search space", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "readme_space.py").write_text(code)
    loaded = load_space(str(tmp_path / "readme_space.py"), world_size=2)
    assert [p.name for p in loaded.params][:2] == ["global_batch", "lr_per_256"]
    assert loaded.warm_starts


@pytest.mark.parametrize(("text", "message"), [
    ("9**9**9", "an exponent is at most 64"),
    ("'a' * 10**13", "arithmetic takes numbers"),
    ("10**14 * 1000", "a value out of range"),
    ("x" + "+x" * 150, "at most 200 parts"),
    ("1" * 1001, "at most 1000 characters"),
])
def test_expressions_are_bounded_before_they_can_run_away(text, message):
    from autotune._expr import Expr

    with pytest.raises(ValueError, match=message):
        Expr(text)({"x": 1.0})


def _quickstart_trial(point: dict) -> tuple[optuna.Study, optuna.Trial]:
    study = optuna.create_study()
    study.enqueue_trial(point)
    return study, study.ask()


def test_a_hand_enqueued_configuration_is_taken_by_its_own_names():
    """Optuna's `study.enqueue_trial` with the batch as users write it (256, not the exponent
    the study stores) trains that batch, not a random one."""
    space = load_space("quickstart", world_size=2)
    point = {"global_batch": 256, "lr_per_256": 0.05, "warmup_epochs": 0.5, "decay": "step",
             "label_smoothing": 0.1, "epochs": 6}
    for _ in range(3):
        study, trial = _quickstart_trial(point)
        assert space.sample(trial) == point
        assert study.trials[-1].params["global_batch_log2"] == 8


def test_a_hand_enqueued_configuration_outside_the_space_is_refused_with_every_reason():
    space = load_space("quickstart", world_size=2)
    _, trial = _quickstart_trial({"global_batch": 1000, "lr_per_256": 5.0, "decay": "exp",
                                  "epochs": 100, "lr": 0.1})
    with pytest.raises(InfeasiblePoint) as e:
        space.sample(trial)
    assert str(e.value) == (
        "the enqueued configuration is not in the search space: global_batch 1000 is not a "
        "power of two [16, 512]; lr_per_256 5.0 is outside float [0.01, 2] log; decay 'exp' "
        "is not one of cosine, linear, step; epochs 100 is outside int [3, 12]; lr is not "
        "a parameter of space 'quickstart' (its parameters: global_batch, lr_per_256, "
        "warmup_epochs, decay, label_smoothing, epochs)")
    _, trial = _quickstart_trial({"global_batch_log2": 12})
    with pytest.raises(InfeasiblePoint, match="global_batch_log2 12 is not an exponent of a "
                                              r"power of two \[16, 512\]$"):
        space.sample(trial)


def test_the_worker_drops_a_hand_enqueued_configuration_outside_the_space_and_says_why(
        tmp_path, capsys):
    """It used to end the worker in a traceback (Optuna's ValueError on a categorical value
    not among the choices), leaving the trial RUNNING and counted against the budget for good;
    numbers out of range trained with a warning. Now the trial is recorded as dropped, with
    why, and the next one is taken."""
    from autotune import record
    from autotune.config import StudyConfig
    from autotune.modes import make_pruner, make_sampler
    from autotune.trial_runner import TrialRunner

    cfg = StudyConfig()
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}",
                                direction="minimize", sampler=make_sampler(cfg, 0),
                                pruner=make_pruner(cfg))
    study.enqueue_trial({"global_batch": 128, "decay": "exp"})
    runner = TrialRunner(cfg, load_space("quickstart", world_size=2), 1437,
                         run_dir=tmp_path / "runs")
    trial, params = runner._ask(study)
    dropped = study.trials[0]
    assert dropped.state.name == "FAIL" and dropped.user_attrs[record.OUTCOME] == "infeasible"
    assert dropped.user_attrs[record.DETAIL] == (
        "the enqueued configuration is not in the search space: decay 'exp' is not one of "
        "cosine, linear, step")
    why = dropped.user_attrs[record.DETAIL]
    assert capsys.readouterr().out == f"autotune: trial 0 dropped: {why}\n"
    assert trial.number == 1 and set(params) >= {"global_batch", "decay"}


def test_status_lists_a_queued_configuration_with_its_values(tmp_path, monkeypatch, capsys):
    from autotune import record
    from autotune.cli import main

    monkeypatch.chdir(tmp_path)
    study = optuna.create_study(study_name="q", storage="sqlite:///autotune.db")
    study.set_user_attr(record.STUDY_CONFIG, {"study_name": "q"})
    study.enqueue_trial({"global_batch": 64, "lr_per_256": 0.05})
    assert main(["status", "q"]) == 0
    queued = [line for line in capsys.readouterr().out.splitlines() if "WAITING" in line]
    assert queued == [f"{0:>5}  WAITING   {'':10}  {'':14}  {'':>9}  global_batch=64 "
                      "lr_per_256=0.05"]


@pytest.mark.parametrize("world_size", [1, 2, 3, 6, 256, 512, 1024, 1437])
def test_the_quickstart_space_builds_for_any_number_of_ranks_its_images_can_feed(world_size):
    # 512 and 1024 ranks (a power of two at the batch's upper end) made an empty range
    # ("low (512) must be below high (512)"), 1,438 and more an empty list (min() of nothing)
    from autotune.space import load_space

    space = load_space("quickstart", world_size=world_size)
    batch = next(p for p in space.params if p.name == "global_batch")
    assert all(b % world_size == 0 and b <= 1437 for b in batch.values())
    assert space.warm_starts[0]["global_batch"] in batch.values()


def test_the_quickstart_space_says_how_many_ranks_its_images_feed():
    from autotune.errors import SpaceError
    from autotune.space import load_space

    with pytest.raises(SpaceError, match="the digits' 1437 training images cannot give each "
                                         "of 1438 ranks an image a step; run the quickstart "
                                         "on at most 1437 ranks"):
        load_space("quickstart", world_size=1438)
