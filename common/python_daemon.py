"""The Python workers' daemon (spark.python.daemon.module): PySpark's own, with one change.

Before every task a PySpark worker calls importlib.invalidate_caches(), so that files added to
the job (addPyFile) become importable. Python's finder for a zip archive on sys.path answers it
by reading the archive's whole directory again, in pure Python. Spark puts three archives at the
head of every worker's PYTHONPATH (pyspark.zip, py4j's, and the spark-core jar), and each package
imported from them holds its own finder: every task of gold's sessions (applyInPandasWithState)
re-read them, about 0.3 s of a core per task, two tasks per batch, with or without data
(measured: an empty batch of a pandas stateful query 0.9-1.2 s, 0.4 s with this change; a JVM
stateful operator's 0.2 s). The archives never change while a worker lives (Spark does not
overwrite an added file), so their finders keep what they read; every other finder, and the
finders on sys.meta_path, are invalidated as before.

The workers are forks of this process: they inherit the change. Spark runs this module with
`python -m`, with the worker module as its argument, which pyspark.daemon reads as its own."""
from __future__ import annotations

import importlib
import runpy
import sys
import zipimport

_invalidate_everything = importlib.invalidate_caches


def invalidate_caches() -> None:
    """importlib.invalidate_caches, except that zip archives' finders keep their directory."""
    kept = {path: finder for path, finder in sys.path_importer_cache.items()
            if isinstance(finder, zipimport.zipimporter)}
    for path in kept:
        del sys.path_importer_cache[path]
    try:
        _invalidate_everything()
    finally:
        sys.path_importer_cache.update(kept)


if __name__ == "__main__":
    from common.python_daemon import invalidate_caches as keeping_zip_directories  # named by its module

    importlib.invalidate_caches = keeping_zip_directories
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)
