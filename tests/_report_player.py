"""A stand-in trainer for tests: plays recorded evaluation reports to a worker over the real
report channel, following the trainer's rules (between evaluations it stops at the deadline
of the last reply; it stops when told to, and ends once the target is reached), and writes
every reply it got to a JSON file.

    python tests/_report_player.py HOST:PORT REPORTS.json REPLIES.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainers.reporter import SocketReporter  # noqa: E402


def main() -> None:
    address, reports, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    evals = json.loads(reports.read_text())
    reporter = SocketReporter(address)
    replies = [reporter.send({"type": "start", "setup_s": 0.1, "world_size": 1,
                              "hosts": ["test"], "pid": 0, "served": 1})]
    deadline = replies[-1].get("deadline_s")
    end = {"type": "end", "reason": "planned_epochs", "tta_s": None}
    elapsed = 0.0
    for msg in evals:
        if deadline is not None and msg["elapsed_s"] > deadline:
            end["reason"], elapsed = "bound", deadline
            break
        elapsed = msg["elapsed_s"]
        reply = reporter.send({"type": "eval", **msg})
        replies.append(reply)
        deadline = reply.get("deadline_s")
        if msg.get("reached"):
            end["reason"], end["tta_s"] = "reached", elapsed
            break
        if reply.get("action") == "stop":
            end["reason"] = "stopped"
            break
    reporter.send({**end, "elapsed_s": elapsed})
    reporter.close()
    out.write_text(json.dumps(replies))


if __name__ == "__main__":
    main()
