"""A run killed while a query logged its first batch must not leave the query unable to start."""
from __future__ import annotations

import pytest

from common.streaming import clear_interrupted_first_batch


def _run(spark, source, checkpoint):
    q = (spark.readStream.text(str(source)).writeStream.format("noop")
         .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    q.awaitTermination()


def test_a_first_batch_killed_while_being_logged_is_cleared_and_the_query_starts(spark, tmp_path):
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    source.mkdir()
    (source / "a.txt").write_text("one\ntwo\n")
    offsets = checkpoint / "offsets"
    offsets.mkdir(parents=True)
    # What a kill between writing the entry's temporary file and renaming it leaves.
    (offsets / ".0.0b9a4c1e-tmp-entry.tmp").write_text('v1\n{"batchWatermarkMs":0}\n')
    (offsets / "..0.0b9a4c1e-tmp-entry.tmp.crc").write_bytes(b"crc")

    with pytest.raises(Exception, match="STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY"):
        _run(spark, source, checkpoint)      # Spark alone refuses the checkpoint for good

    assert sorted(clear_interrupted_first_batch(str(checkpoint))) == [
        "..0.0b9a4c1e-tmp-entry.tmp.crc", ".0.0b9a4c1e-tmp-entry.tmp"]
    _run(spark, source, checkpoint)
    assert (offsets / "0").is_file() and (checkpoint / "commits" / "0").is_file()

    # Once a batch is logged, the offset log is Spark's: nothing is removed.
    stray = offsets / ".1.f00.tmp"
    stray.write_text("partial")
    assert clear_interrupted_first_batch(str(checkpoint)) == []
    assert stray.exists()
    assert clear_interrupted_first_batch(str(tmp_path / "never-started")) == []
