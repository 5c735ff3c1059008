"""MLflow's place in trainer processes: autotune puts this folder first on their PYTHONPATH.

DeepSpeed imports MLflow whenever it is installed, for its own autotuner, which autotune does
not use: about 2 s of CPU in the launcher and in every rank at each trial's start (MLflow pulls
in pandas and FastAPI). A trainer never uses MLflow (it reports through trainers.reporter, and
the worker records to MLflow), so here the import fails at once and DeepSpeed goes on without.
"""

raise ImportError("MLflow is not importable in autotune's trainer processes (see "
                  "trainers/_no_mlflow); a trainer reports through trainers.reporter")
