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
