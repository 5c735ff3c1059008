"""DeepSpeed's one-node launcher, tied to the worker that starts it.

``python -m trainers._launch ARGS`` is ``python -m deepspeed.launcher.launch ARGS`` in a
process that the kernel kills when its worker exits (``_lifeline``); its ranks, tied to it
the same way, follow."""

from __future__ import annotations

import runpy
import sys

if __name__ == "__main__":
    from trainers._lifeline import die_with_parent

    die_with_parent()
    sys.argv = ["deepspeed.launcher.launch", *sys.argv[1:]]
    runpy.run_module("deepspeed.launcher.launch", run_name="__main__", alter_sys=True)
