"""Replaying studies on recorded learning curves: how much compute a tuner spends to find a
fast configuration, without training anything.

``load_table("opda:PATH", target=0.70)`` (or ``yahpo-lcbench:INSTANCE``, or a table
``benchmarks/search_efficiency.py record`` wrote) reads a table; ``Replay(table, method,
seed, workers).run()`` replays one study of a method on it. autotune's method makes its
decisions through ``autotune.decisions``, the same pieces a worker calls.
``uniform_bound(table)`` says what the table asks of any tuner: how often a uniform proposal
trains a goal configuration, and the compute an oracle pruner would spend with such proposals.
"""

from ._bounds import UniformBound, uniform_bound
from ._sim import METHODS, Outcome, Replay, WallClockASHA, sh_budgets
from ._tables import Run, Table, TableError, load_table

__all__ = ["METHODS", "Outcome", "Replay", "Run", "Table", "TableError", "UniformBound",
           "WallClockASHA", "load_table", "sh_budgets", "uniform_bound"]
