"""DeepSpeed's CPU op: each Python environment has its own extension folder (no shared lock),
a user's TORCH_EXTENSIONS_DIR wins, and a worker builds the op there once, before any trial,
so a trial's setup never includes the build."""

from __future__ import annotations

import sys

from autotune import _ops
from autotune.launch import trainer_env


def test_each_environment_has_its_own_folder_and_the_users_choice_wins(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    _ops._environment_key.cache_clear()
    here = _ops.extensions_dir()
    monkeypatch.setattr(sys, "prefix", "/some/other/venv")
    _ops._environment_key.cache_clear()
    other = _ops.extensions_dir()
    _ops._environment_key.cache_clear()
    assert here != other and here.startswith(str(tmp_path)) and other.startswith(str(tmp_path))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "mine"))
    assert _ops.extensions_dir() == str(tmp_path / "mine")
    assert trainer_env("cpu", 1)["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "mine")


def test_a_built_op_is_not_built_again(tmp_path):
    folder = tmp_path / "py311_cpu" / "deepspeed_shm_comm"
    folder.mkdir(parents=True)
    (folder / "deepspeed_shm_comm.so").write_bytes(b"")
    said: list[str] = []
    assert _ops.ensure_cpu_ops({"TORCH_EXTENSIONS_DIR": str(tmp_path)}, said.append) == 0.0
    assert said == []


def test_a_home_that_cannot_be_written_builds_in_a_private_temporary_folder(monkeypatch,
                                                                          tmp_path):
    # a container's read-only home: the ranks failed making torch's build folder there, and
    # every trial crashed
    import os
    import tempfile

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.delenv("AUTOTUNE_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", "/proc/no-home")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = _ops.extensions_dir()
    own = tmp_path / f"autotune-{os.getuid()}"
    assert folder.startswith(str(own / "torch_extensions"))
    assert (own.stat().st_mode & 0o777) == 0o700
    assert trainer_env("cpu", 1)["TORCH_EXTENSIONS_DIR"] == folder
    # one another user could write to (or made first) is not used: its code would be loaded
    own.chmod(0o777)
    assert _ops.extensions_dir().startswith("/proc/no-home/")
