"""common/python_daemon.py: Python workers that keep their zip archives' directories between tasks
and still find files added to a folder on their path."""
from __future__ import annotations

import importlib
import sys
import zipfile

import pytest

from common import python_daemon


def test_a_zip_archive_s_finder_keeps_its_directory_and_a_folder_s_new_module_is_found(tmp_path, monkeypatch):
    archive, folder = tmp_path / "lib.zip", tmp_path / "folder"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("lakehouse_probe_zipped.py", "X = 1\n")
    folder.mkdir()
    monkeypatch.syspath_prepend(str(archive))
    monkeypatch.syspath_prepend(str(folder))
    for name in ("lakehouse_probe_zipped", "lakehouse_probe_added"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert importlib.import_module("lakehouse_probe_zipped").X == 1
    finder = sys.path_importer_cache[str(archive)]
    rereads = []
    monkeypatch.setattr(finder, "invalidate_caches", lambda: rereads.append(1))
    with pytest.raises(ImportError):
        importlib.import_module("lakehouse_probe_added")
    (folder / "lakehouse_probe_added.py").write_text("Y = 2\n")

    python_daemon.invalidate_caches()
    assert rereads == [] and sys.path_importer_cache[str(archive)] is finder
    assert importlib.import_module("lakehouse_probe_added").Y == 2     # a task's added file
    python_daemon._invalidate_everything()       # what PySpark's worker runs before every task
    assert rereads == [1]


def test_the_session_s_python_workers_run_under_it(spark):
    import pandas as pd

    def which(batches):
        import importlib as lib
        for _ in batches:
            yield pd.DataFrame({"invalidate": [lib.invalidate_caches.__module__]})

    rows = spark.range(4, numPartitions=2).mapInPandas(which, "invalidate string").collect()
    assert {r.invalidate for r in rows} == {"common.python_daemon"}


def test_spark_s_copies_of_installed_packages_go_behind_site_packages_and_others_stay(tmp_path):
    site, home = tmp_path / "site-packages", tmp_path / "spark-home"
    for package in ("pyspark", "py4j"):
        (site / package).mkdir(parents=True)
        (site / package / "__init__.py").write_text("")
    lib = site / "pyspark" / "python" / "lib"
    ours, theirs = str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")
    lone = str(lib / "other.zip")                         # no package of that name beside it
    spark_home = str(home / "python" / "lib" / "pyspark.zip")
    paths = ["", ours, theirs, lone, spark_home, "/usr/lib/python311.zip", str(site)]
    assert python_daemon.prefer_installed(paths) == \
        ["", lone, spark_home, "/usr/lib/python311.zip", str(site), ours, theirs]
    # Without site-packages on the path, nothing moves.
    assert python_daemon.prefer_installed(paths[:-1]) == paths[:-1]


def test_the_workers_load_pyspark_and_py4j_from_site_packages(spark):
    import pandas as pd

    def where(batches):
        import sys
        for _ in batches:
            import py4j
            import pyspark
            yield pd.DataFrame({"pyspark": [pyspark.__file__], "py4j": [py4j.__file__],
                                "zips": [sum(p.endswith(".zip") and "pyspark" in p for p in sys.path)]})

    rows = spark.range(2, numPartitions=1).mapInPandas(where, "pyspark string, py4j string, zips int").collect()
    for r in rows:
        assert ".zip" not in r.pyspark and ".zip" not in r.py4j, r
        assert r.zips >= 1        # still on the path, behind: nothing Spark put there is lost
