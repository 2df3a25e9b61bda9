"""The pipeline application: every layer's streaming flows, declared once and run by one runner.

    python -m pipeline [--layer all|bronze|silver|gold] [--trigger ...]   (make run-all, run-<layer>)

Each layer module declares a `Layer` (flows.py): its preflight checks, the tables it prepares and
its flows (one streaming query each: source -> transform -> sink, checkpoint, FAIR pool, recovery
policy). `runner.run` locks every selected checkpoint, builds one SparkSession with one progress
listener and one signal handler, and starts the flows: layer after layer in available-now mode
(each layer reads what the one before committed), all at once in processing-time mode.
"""
