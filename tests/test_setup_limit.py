"""A trial's setup has its own limit, counted from its launch: a trainer that has not reached
its first step by then is stopped and failed as setup_timeout, saying so, and the study goes
on; its training limit starts only at the first step."""

from __future__ import annotations

import optuna
import psutil
import yaml

from .conftest import run_cli


def test_a_setup_past_its_limit_fails_as_setup_timeout_and_says_why(tmp_path):
    study = {"study_name": "slow-setup", "search_space": "quickstart", "ranks_per_trial": 1,
             "trainer": {"model": "resnet18", "data": {"kind": "digits", "image_size": 32},
                         "setup_limit_s": 1, "eval_every_s": 2.0},
             "budget": {"n_trials": 1, "max_trial_s": 10}, "tracking_uri": "mlruns"}
    (tmp_path / "slow.yaml").write_text(yaml.safe_dump(study))
    result = run_cli("start", "study", "slow.yaml", cwd=tmp_path, timeout=300)
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "setup_timeout" in result.stdout, result.stdout
    trial = optuna.load_study(study_name="slow-setup",
                              storage=f"sqlite:///{tmp_path / 'autotune.db'}").trials[0]
    assert trial.state.name == "FAIL"
    assert trial.user_attrs["stop_reason"] == "setup_timeout"
    assert "within 1 s of its launch (trainer.setup_limit_s)" in trial.user_attrs["detail"]
    left = [p for p in psutil.process_iter(["cmdline"])
            if any(str(tmp_path) in a for a in (p.info["cmdline"] or []))]
    assert not left, [p.info["cmdline"] for p in left]
    assert "phase" in trial.user_attrs["detail"]     # where the setup was when it was stopped


def test_setup_notes_say_where_the_setup_is_and_get_no_reply(tmp_path):
    """A trainer's setup notes are kept by the channel, never yielded nor answered, and a
    setup stopped at its limit is reported with the phase it was in."""
    import sys
    import time

    from autotune._process import ReportChannel, TrainerProcess
    from autotune._reports import setup_whereabouts

    channel = ReportChannel()
    script = (
        "import json, socket, sys, time\n"
        "host, port = sys.argv[1].rsplit(':', 1)\n"
        "s = socket.create_connection((host, int(port)))\n"
        "for phase in ('distributed', 'data'):\n"
        "    s.sendall((json.dumps({'type': 'setup', 'phase': phase, 'at_s': 0.1}) + '\\n')"
        ".encode())\n"
        "s.settimeout(1.5)\n"
        "try:\n"
        "    print('replied', s.recv(100), flush=True)\n"
        "except TimeoutError:\n"
        "    print('no reply', flush=True)\n"
        "time.sleep(30)\n")
    process = TrainerProcess([sys.executable, "-c", script, channel.address], {},
                             tmp_path / "fake.log")
    launched = time.monotonic()
    try:
        assert list(channel.messages(process, launched + 3.0)) == []   # notes are not yielded
        assert channel.setup_note["phase"] == "data"
        where = setup_whereabouts(channel, launched)
        assert "opening the data source (phase 'data'" in where
    finally:
        process.kill(grace_s=1)
        process.wait()
        channel.close()
    assert "no reply" in (tmp_path / "fake.log").read_text()
    channel.setup_note = None
    assert "never reported a setup phase" in setup_whereabouts(channel, launched)
