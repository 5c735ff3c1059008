"""Study-store load: N simulated workers against PostgreSQL directly and through `autotune
server`.

    python benchmarks/server_load.py [--workers 8,64,256] [--seconds 30] [--processes 4]

Each simulated worker has its own storage client (a direct connection pool, or autotune's gRPC
client of the study server) and loops: ask; k x (a pause as if training to the next
evaluation, by default 5-15 s; report an intermediate value; should_prune with Optuna's
median rule); tell. ``--pause 1,3`` is the quickstart's pace (an evaluation every 2 s), much
more frequent than a real training job's. Workers are threads spread
over a few processes (256 Python processes would not fit in this machine's memory). Every
case gets a fresh database on the PostgreSQL server at ``--postgres`` (default: this
machine's, 127.0.0.1:5432, whose default limit is 100 connections).

Per case it prints trials/s, p50 and p99 latency of the storage calls (ask, report +
should_prune, tell), and errors. Goals: at N = 256 the server path finishes with 0 errors and
p99 <= 1 s; at N = 8 the server path reaches >= 0.8x the direct throughput. Last line:
``server_tps_8=.. direct_tps_8=.. ratio_8=.. server_errors_256=.. server_p99_256_s=..
direct_errors_256=..``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
STUDY = "load"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _admin(server_url: str, sql: str) -> None:
    import psycopg2

    conn = psycopg2.connect(f"{server_url}/postgres")
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


def _storage(mode: str, target: str) -> Any:
    """The client autotune's workers use, without patience (no retries: errors count), so a
    new trial is created holding its worker's mark as a worker asks for it."""
    import optuna

    from autotune._retry import RetryingStorage

    if mode == "server":
        from autotune.store import open_storage

        inner = open_storage(f"autotune://{target}").inner
    else:
        inner = optuna.storages.RDBStorage(target)
    return RetryingStorage(inner, mode, patience_s=0.0)


def _worker(mode: str, target: str, stop_at: float, seed: int, out: list[Any],
            reports: int, pause: tuple[float, float]) -> None:
    """One simulated worker: its own client, ask / report + prune / tell until ``stop_at``."""
    import optuna

    rng = random.Random(seed)
    latencies: list[float] = []
    errors: list[str] = []
    trials = 0
    time.sleep(rng.uniform(0, pause[1]))      # workers join over one pause, not in lockstep
    study = None
    while time.monotonic() < stop_at:
        try:
            if study is None:
                storage = _storage(mode, target)
                study = optuna.load_study(study_name=STUDY, storage=storage,
                                          sampler=optuna.samplers.RandomSampler(seed=seed),
                                          pruner=optuna.pruners.MedianPruner(
                                              n_startup_trials=5, n_warmup_steps=1))
            t = time.perf_counter()
            with storage.new_trials_hold({"asked_by": f"worker-{seed}"}):
                trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
            latencies.append(time.perf_counter() - t)
            x = float(trial.params["x"])
            pruned = False
            for step in range(reports):
                time.sleep(rng.uniform(*pause))           # as if training to the next evaluation
                t = time.perf_counter()
                trial.report(x * (reports - step), step)
                pruned = trial.should_prune()
                latencies.append(time.perf_counter() - t)
                if pruned:
                    break
            t = time.perf_counter()
            if pruned:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            else:
                study.tell(trial, x)
            latencies.append(time.perf_counter() - t)
            trials += 1
        except Exception as e:  # noqa: BLE001 - counted; the worker goes on after a pause
            errors.append(f"{type(e).__name__}: {' '.join(str(e).split())[:120]}")
            time.sleep(1.0)
    out.append((trials, latencies, errors))


def _process(mode: str, target: str, threads: int, seconds: float, first_seed: int,
             queue: Any, reports: int, pause: tuple[float, float]) -> None:
    warnings.filterwarnings("ignore")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    stop_at = time.monotonic() + seconds
    results: list[Any] = []
    pool = [threading.Thread(target=_worker, args=(mode, target, stop_at, first_seed + i,
                                                   results, reports, pause), daemon=True)
            for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(seconds + 120)
    queue.put(results)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_case(mode: str, n: int, postgres: str, seconds: float, processes: int,
             reports: int, pause: tuple[float, float]) -> dict[str, Any]:
    import optuna

    name = f"autotune_load_{uuid.uuid4().hex[:8]}"
    _admin(postgres, f'CREATE DATABASE "{name}"')
    url = f"{postgres}/{name}"
    server = None
    try:
        direct = url.replace("postgresql://", "postgresql+psycopg2://", 1)
        optuna.create_study(study_name=STUDY, storage=direct, direction="minimize")
        target = direct
        if mode == "server":
            port = _free_port()
            server = subprocess.Popen(
                [sys.executable, "-m", "autotune", "server", "--storage", url, "--port",
                 str(port)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": str(ROOT)})
            deadline = time.monotonic() + 60
            while True:
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", port)) == 0:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError("autotune server did not start")
                time.sleep(0.2)
            target = f"127.0.0.1:{port}"
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        procs = min(processes, n)
        share = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
        started = time.monotonic()
        children = [ctx.Process(target=_process, args=(mode, target, k, seconds, 1000 * i,
                                                       queue, reports, pause))
                    for i, k in enumerate(share)]
        for c in children:
            c.start()
        results = [r for _ in children for r in queue.get(timeout=seconds + 300)]
        for c in children:
            c.join(60)
        wall = time.monotonic() - started
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
        try:
            _admin(postgres, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except Exception:  # noqa: BLE001 - best effort
            pass
    trials = sum(r[0] for r in results)
    latencies = [x for r in results for x in r[1]]
    errors = [e for r in results for e in r[2]]
    return {"mode": mode, "n": n, "trials": trials, "tps": trials / seconds, "wall_s": wall,
            "p50": _percentile(latencies, 0.50), "p99": _percentile(latencies, 0.99),
            "calls": len(latencies), "errors": len(errors),
            "first_error": errors[0] if errors else ""}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="8,64,256", help="comma-separated N")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds per case")
    parser.add_argument("--reports", type=int, default=3, help="reports per trial")
    parser.add_argument("--pause", default="5,15",
                        help="MIN,MAX seconds of training between reports (default 5,15: an "
                             "evaluation every 10 s on average)")
    parser.add_argument("--processes", type=int, default=4, help="processes the threads share")
    parser.add_argument("--postgres", default=os.environ.get(
        "AUTOTUNE_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432"),
        help="PostgreSQL server URL (a database is created per case)")
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.workers.split(",")]
    low, high = (float(v) for v in args.pause.split(","))
    print(f"{args.reports} reports per trial, {low:g}-{high:g} s apart; {args.seconds:g} s per "
          f"case; threads over {args.processes} processes", flush=True)
    rows = []
    print(f"{'path':7} {'N':>4} {'trials/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'calls':>7} "
          f"{'errors':>7}", flush=True)
    for n in sizes:
        for mode in ("direct", "server"):
            r = run_case(mode, n, args.postgres.rstrip("/"), args.seconds, args.processes,
                         args.reports, (low, high))
            rows.append(r)
            print(f"{mode:7} {n:>4} {r['tps']:9.2f} {r['p50'] * 1000:8.1f} "
                  f"{r['p99'] * 1000:8.1f} {r['calls']:7d} {r['errors']:7d}"
                  + (f"  first error: {r['first_error']}" if r["errors"] else ""), flush=True)
    by = {(r["mode"], r["n"]): r for r in rows}
    small, large = min(sizes), max(sizes)
    ratio = by[("server", small)]["tps"] / max(by[("direct", small)]["tps"], 1e-9)
    print(f"server_tps_{small}={by[('server', small)]['tps']:.2f} "
          f"direct_tps_{small}={by[('direct', small)]['tps']:.2f} ratio_{small}={ratio:.2f} "
          f"server_errors_{large}={by[('server', large)]['errors']} "
          f"server_p99_{large}_s={by[('server', large)]['p99']:.3f} "
          f"direct_errors_{large}={by[('direct', large)]['errors']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
