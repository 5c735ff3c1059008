"""The search-space API: validation, sampling, serialization, loading from files."""

from __future__ import annotations

import json

import optuna
import pytest

from autotune import Categorical, Fixed, Float, Int, PowerOfTwo, SearchSpace, SpaceError
from autotune.space import load_space, shipped_spaces

optuna.logging.set_verbosity(optuna.logging.WARNING)


def space() -> SearchSpace:
    return SearchSpace(PowerOfTwo("global_batch", 16, 512), Float("lr_per_256", 0.01, 2, log=True),
                       Categorical("decay", ["cosine", "linear"]), Int("epochs", 3, 12),
                       Fixed("momentum", 0.9),
                       warm_starts=[{"global_batch": 128, "lr_per_256": 0.04, "decay": "cosine",
                                     "epochs": 8, "momentum": 0.9}])


def test_samples_stay_in_range_and_batches_are_powers_of_two():
    s = space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(30):
        values = s.sample(study.ask())
        assert values["global_batch"] in {16, 32, 64, 128, 256, 512}
        assert 0.01 <= values["lr_per_256"] <= 2
        assert values["decay"] in ("cosine", "linear") and 3 <= values["epochs"] <= 12
        assert values["momentum"] == 0.9


def test_warm_starts_enqueue_as_the_exact_point():
    s = space()
    study = optuna.create_study()
    study.enqueue_trial(s.encode(s.warm_starts[0]))
    assert s.sample(study.ask()) == s.warm_starts[0]


def test_round_trips_through_json():
    s = space()
    again = SearchSpace.from_dict(json.loads(json.dumps(s.to_dict())))
    assert again.to_dict() == s.to_dict()
    assert again.table() == s.table()


@pytest.mark.parametrize(("build", "message"), [
    (lambda: Float("x", 1.0, 1.0), "low (1.0) must be below high (1.0)"),
    (lambda: Float("x", 0.0, 1.0, log=True), "log range needs low > 0"),
    (lambda: Int("x", 1.5, 3), "low must be an integer"),
    (lambda: PowerOfTwo("x", 3, 16), "low must be a power of two"),
    (lambda: Categorical("x", []), "choices must not be empty"),
    (lambda: Categorical("x", "abc"), "choices must be a list"),
    (lambda: Float("not a name", 0, 1), "must be a Python identifier"),
    (lambda: SearchSpace(Int("x", 1, 2), Int("x", 1, 3)), "declared twice"),
    (lambda: SearchSpace(Int("x", 1, 2), warm_starts=[{}]), "lacks x"),
])
def test_bad_spaces_are_refused_when_built(build, message):
    with pytest.raises(SpaceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build()


def test_shipped_quickstart_scales_its_smallest_batch_to_the_world_size():
    assert "quickstart" in shipped_spaces()
    small, large = load_space("quickstart", world_size=2), load_space("quickstart", world_size=64)
    assert small.params[0].low == 16 and large.params[0].low == 64


def test_a_user_file_defining_space_loads(tmp_path):
    (tmp_path / "mine.py").write_text(
        "from autotune import SearchSpace, Int\nspace = SearchSpace(Int('epochs', 2, 4))\n")
    loaded = load_space("mine.py", base_dir=str(tmp_path))
    assert loaded.name == "mine" and [p.name for p in loaded.params] == ["epochs"]


def test_a_file_without_space_says_what_to_define(tmp_path):
    (tmp_path / "empty.py").write_text("x = 1\n")
    with pytest.raises(SpaceError, match="must define `space`"):
        load_space(str(tmp_path / "empty.py"))


def test_the_readme_example_is_a_valid_space(tmp_path):
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## Writing a search space", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "readme_space.py").write_text(code)
    loaded = load_space(str(tmp_path / "readme_space.py"), world_size=2)
    assert [p.name for p in loaded.params][:2] == ["global_batch", "lr_per_256"]
    assert loaded.warm_starts and loaded.encode(loaded.warm_starts[0])["global_batch_log2"] == 7
