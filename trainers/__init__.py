"""Training programs that autotune starts with the ``deepspeed`` launcher.

A trainer receives a resolved training plan (a JSON file) and reports each evaluation through
:mod:`trainers.reporter`. It imports nothing of Optuna or MLflow: everything it needs to know is
in the plan, and everything it has to say goes through the reporter. autotune starts trainers
with ``_no_mlflow`` first on their path, so MLflow cannot be imported there (DeepSpeed would
import it for nothing, about 2 s a process at each start).
"""
