"""Checks of this machine that a study or worker makes before it writes anything: the folders it
will write can be made, and the ranks it will start fit the cores or GPUs it has; and the
largest micro-batch that fits this machine's device memory (``probe_micro_batch``).

Each raises a one-line :class:`ConfigError` that says what is wrong and what to do; none
leaves anything behind (a folder is probed by making and removing a temporary one inside its
nearest existing parent)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import AutotuneError, ConfigError
from .launch import trainer_env, trainer_path

if TYPE_CHECKING:
    from .config import StudyConfig

__all__ = ["access_advice", "check_ranks", "check_tracking_access", "check_writable",
           "probe_micro_batch"]
log = logging.getLogger("autotune")


def _is_url(text: str) -> bool:
    return bool(re.match(r"^[a-z][a-z0-9+.-]*:", text)) and not re.match(r"^[A-Za-z]:[\\/]",
                                                                           text)


def check_writable(path: str, key: str) -> None:
    """A one-line error unless the folder ``path`` (``key`` names it in the error) exists and
    is writable or can be made. URLs (an MLflow server, ``sqlite:``) are left to their owner."""
    if not path or _is_url(path):
        return
    folder = Path(path)
    parent = folder
    while not parent.exists():
        if parent.parent == parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{key} {path!r} cannot be made: {parent} is a file, not a folder; "
                          "name a folder")
    try:
        probe = tempfile.mkdtemp(prefix=".autotune-probe-", dir=parent)
    except OSError as e:
        raise ConfigError(f"{key} {path!r} cannot be written ({e.strerror or e} in "
                          f"{parent}); name a folder you can write") from None
    shutil.rmtree(probe, ignore_errors=True)


def access_advice(status: int,
                  where: str = "where autotune runs: the study's command and its workers",
                  uri: str = "") -> str:
    """What to do about an MLflow server that answered ``status`` (401: not authenticated,
    403: permission denied) to this client, with the credentials MLflow's client reads from
    the environment, or the user in the tracking URI ``uri`` (the password is never said);
    ``where`` says where to set them."""
    from urllib.parse import unquote, urlparse

    in_uri = urlparse(uri).username if uri else None
    if in_uri and not os.environ.get("MLFLOW_TRACKING_USERNAME"):
        if status == 401:
            return (f"the MLflow server does not accept user {unquote(in_uri)!r} of the "
                    "tracking URI (401 not authenticated); check the password in it")
        return (f"the MLflow server denies user {unquote(in_uri)!r} of the tracking URI (403 "
                "permission denied); ask its administrator for access, or give a user who "
                "has it")
    user = os.environ.get("MLFLOW_TRACKING_USERNAME")
    if os.environ.get("MLFLOW_TRACKING_TOKEN") and not user:
        who = "the token in MLFLOW_TRACKING_TOKEN"
    else:
        who = f"user {user!r}" if user else "a client with no credentials"
    if status == 401:
        fix = ("check MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)" if user or
               os.environ.get("MLFLOW_TRACKING_TOKEN") else
               "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or "
               f"MLFLOW_TRACKING_TOKEN) {where}")
        return f"the MLflow server does not accept {who} (401 not authenticated); {fix}"
    return (f"the MLflow server denies {who} (403 permission denied); ask its administrator "
            "for access, or set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD of a "
            "user who has it")


_WHERE_MLFLOW_RECORDS = ("give http(s)://HOST:PORT (where `mlflow server` listens), a database "
                         "URL (sqlite:///PATH, postgresql://USER@HOST/DB, mysql://...) or a "
                         "local folder")


def tracking_uri_problem(uri: str) -> str | None:
    """What makes ``uri`` (a resolved tracking URI) one MLflow cannot record to, or None;
    the schemes are MLflow's own registry's (plugins included)."""
    from urllib.parse import urlparse

    scheme = uri.split(":", 1)[0].lower() if re.match(r"^[a-z][a-z0-9+.-]*:", uri, re.I) \
        else ""
    if scheme in ("http", "https"):
        return None if urlparse(uri).hostname else f"names no host; {_WHERE_MLFLOW_RECORDS}"
    try:
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry
    except ImportError:            # another MLflow's internals: its own first write says
        return None
    try:
        _tracking_store_registry.get_store_builder(uri)
    except Exception:  # noqa: BLE001 - MLflow's "unsupported URI": no store for the scheme
        return f"is not a store MLflow records to ({scheme}://); {_WHERE_MLFLOW_RECORDS}"
    return None


def check_tracking_access(uri: str, key: str = "tracking_uri") -> None:
    """A one-line error where the MLflow tracking server at ``uri`` refuses this client (401
    or 403), or where a web server that is not MLflow's answers there (404): its records would
    wait for good, not for an outage. One request, no retry; a server that does not answer
    is left to the records' delivery, which waits for it (MLflow down for a minute is a fault
    a study survives). Only http(s) servers are asked; a URI MLflow
    cannot record to at all (a scheme it has no store for, an http URL without a host) is
    refused first."""
    problem = tracking_uri_problem(uri)
    if problem:
        from .config import redact

        raise ConfigError(f"{key} {redact(uri)} {problem}")
    if not re.match(r"^https?://", uri, re.IGNORECASE):
        return
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    from .config import redact

    try:
        response = http_request(get_default_host_creds(uri), "/api/2.0/mlflow/experiments/search",
                                "GET", max_retries=0, timeout=10, raise_on_status=False,
                                params={"max_results": 1})
    except Exception:  # noqa: BLE001 - not answering: the delivery's retries deal with it
        return
    if response.status_code in (401, 403):
        raise ConfigError(f"{key} {redact(uri)}: "
                          f"{access_advice(response.status_code, uri=uri)}")
    if response.status_code in (404, 405):  # another web server: records would wait for good
        raise ConfigError(f"{key} {redact(uri)}: the server there answers, but not as an MLflow "
                          f"tracking server (HTTP {response.status_code} for MLflow's API); "
                          "give the URL `mlflow server` serves (with its path, behind a proxy)")


def local_slots(device: str) -> tuple[int, str]:
    """How many ranks this machine holds without oversubscribing, and of what."""
    if device == "cuda":
        import torch

        return (torch.cuda.device_count() if torch.cuda.is_available() else 0), "GPU(s)"
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1), "CPU core(s)"


def check_ranks(device: str, ranks: int, workers: int, oversubscribe: bool,
                flag: str = "oversubscribe: true") -> str | None:
    """A one-line error unless ``workers`` local workers of ``ranks`` ranks each fit this
    machine's cores (CPU) or GPUs; a GPU study needs a GPU even when oversubscribed. Where
    they share them on purpose, the line that says so (None where they fit)."""
    slots, what = local_slots(device)
    if device == "cuda" and slots == 0:
        raise ConfigError("device cuda: this machine has no CUDA GPU that torch can use; run "
                          "the study with device: cpu, or its workers on a GPU machine")
    wanted = ranks * max(workers, 1)
    if wanted > slots and not oversubscribe:
        raise ConfigError(f"{workers} local worker(s) x {ranks} rank(s) = {wanted} ranks, but "
                          f"this machine has {slots} {what}: lower ranks_per_trial or "
                          f"workers, run workers on more machines, or set {flag} to share "
                          "them on purpose")
    if wanted > slots:
        return (f"{wanted} ranks share this machine's {slots} {what} (oversubscribe): each "
                "trial trains slower than with one each, alike for every trial")
    return None


def probe_micro_batch(cfg: StudyConfig, ranks: int) -> int:
    """The largest micro-batch (up to the configured cap) whose training step fits in one
    device's memory, measured by ``trainers/probe.py`` on this machine."""
    import subprocess
    import sys

    data = cfg.trainer.data
    command = [sys.executable, str(trainer_path("probe")), "--model", cfg.trainer.model,
               "--num-classes", str(cfg.trainer.num_classes),
               "--image-size", str(int(data.get("image_size", 224))),
               "--start", str(cfg.trainer.max_micro_batch), "--device", cfg.device,
               "--precision", cfg.trainer.precision, "--ranks", str(ranks)]
    done = subprocess.run(command, env=trainer_env(cfg.device, 1), capture_output=True,
                          text=True, timeout=600)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = " ".join(done.stderr.strip().splitlines()[-1:])[:300]
        raise AutotuneError(f"the micro-batch memory probe failed (exit code "
                            f"{done.returncode}): {tail or 'no message'}")
    found = json.loads(lines[-1])
    if int(found["micro_batch"]) < 1:
        raise AutotuneError(f"not even 2 images of {cfg.trainer.model} at "
                            f"{data.get('image_size', 224)} px train within "
                            f"{found['budget_bytes'] / 2**30:.1f} GiB on {cfg.device}; use a "
                            "smaller model or image size")
    log.info("memory probe: micro-batch %s fits (%s)", found["micro_batch"], found["tried"])
    return int(found["micro_batch"])
