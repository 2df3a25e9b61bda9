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

Spark's archives are also put ahead of site-packages. With pip's pyspark they are that package's
own copies (pyspark/python/lib/pyspark.zip, py4j's), and a module imported from a zip archive is
compiled from source in every process, with no bytecode cache: 1.0-1.2 s of a core for the
daemon and its workers' imports (pyspark, its pandas and streaming modules). Archives whose
package is installed beside them go behind site-packages, so the same code loads from its .pyc.

The workers are forks of this process: they inherit both changes. Spark runs this module with
`python -m`, with the worker module as its argument, which pyspark.daemon reads as its own."""
from __future__ import annotations

import gc
import importlib
import os
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


def installed_beside(archive: str, paths: list[str]) -> bool:
    """Whether `archive` is an installed pyspark's copy of a package installed beside it:
    <site>/pyspark/python/lib/<package>[-version-src].zip with <site> on `paths` holding
    <site>/<package>/__init__.py (a Spark home's archives stay where Spark put them)."""
    parts = archive.replace("\\", "/").split("/")
    if len(parts) < 5 or parts[-4:-1] != ["pyspark", "python", "lib"] or not parts[-1].endswith(".zip"):
        return False
    site = "/".join(parts[:-4])
    package = parts[-1][:-len(".zip")].split("-")[0]
    return site in paths and os.path.isfile(os.path.join(site, package, "__init__.py"))


def prefer_installed(paths: list[str]) -> list[str]:
    """`paths` with the archives installed_beside() behind every other entry, in their order."""
    behind = [p for p in paths if installed_beside(p, paths)]
    return [p for p in paths if p not in behind] + behind


if __name__ == "__main__":
    from common.python_daemon import invalidate_caches as keeping_zip_directories  # named by its module

    importlib.invalidate_caches = keeping_zip_directories
    sys.path[:] = prefer_installed(sys.path)
    # Each worker of a pandas function (gold's sessions) imported pandas and pyarrow, 0.9 s of a
    # core, and a run forks several: imported once here, every fork finds them loaded.
    for preloaded in ("pandas", "pyarrow"):
        try:
            importlib.import_module(preloaded)
        except ImportError:     # a job without pandas UDFs need not have them
            pass
    # What the workers inherit lives as long as they do: frozen, Python's full collections in
    # a worker scan only what the worker made (9 in a 20,000-event run-all's sessions, 0.46 s
    # of a core before, 0.09 s after), and leave the inherited pages unwritten.
    gc.freeze()
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)
