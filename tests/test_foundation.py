"""The base everything stands on: Delta with time travel, the catalog, RocksDB, a real Kafka broker."""
import json
import subprocess
import sys

import pytest

from common.catalog import register_tables


def test_session_settings(spark):
    conf = spark.conf
    assert conf.get("spark.sql.session.timeZone") == "UTC"
    assert conf.get("spark.sql.streaming.stateStore.providerClass").endswith("RocksDBStateStoreProvider")
    assert conf.get("spark.sql.extensions") == "io.delta.sql.DeltaSparkSessionExtension"


def test_distinct_valued_columns_are_written_without_a_dictionary(spark, tmp_path):
    """Parquet starts each column with a dictionary and drops it, the work spent, when the values
    are nearly all distinct: the record bytes, event ids and event times (and the profile's
    timestamps) are written plain from the start (common.spark.plain_encoded); other columns keep
    theirs. Here every column repeats 50 values, so a dictionary would pay off and be kept."""
    import pyarrow.parquet as pq

    rows = spark.range(5000).selectExpr("sha2(CAST(id % 50 AS STRING), 256) AS event_id",
                                        "timestamp_seconds(id % 50) AS event_time",
                                        "timestamp_seconds(id % 50) AS start_time",
                                        "CAST(id % 50 AS STRING) AS raw", "CAST(id % 50 AS STRING) AS device_id")
    rows.coalesce(1).write.format("delta").save(str(tmp_path / "t"))
    [data] = (tmp_path / "t").glob("*.parquet")
    meta = pq.ParquetFile(data).metadata.row_group(0)
    encodings = {meta.column(i).path_in_schema: set(meta.column(i).encodings) for i in range(meta.num_columns)}
    dictionary = {"PLAIN_DICTIONARY", "RLE_DICTIONARY"}
    for column in ("event_id", "event_time", "start_time", "raw"):
        assert not encodings[column] & dictionary, (column, encodings[column])
    assert encodings["device_id"] & dictionary, encodings["device_id"]


def test_delta_round_trip_with_time_travel(spark, cfg):
    path = cfg.table_path("bronze", "events")
    spark.createDataFrame([(1, "a"), (2, "b")], "id INT, v STRING").write.format("delta").save(path)
    spark.createDataFrame([(3, "c")], "id INT, v STRING").write.format("delta").mode("append").save(path)
    register_tables(spark, cfg)

    assert spark.table("bronze.events").count() == 3
    v0 = spark.sql("SELECT id FROM bronze.events VERSION AS OF 0 ORDER BY id").collect()
    assert [r.id for r in v0] == [1, 2]
    history = spark.sql("DESCRIBE HISTORY bronze.events").orderBy("version").collect()
    assert [(h.version, h.operation) for h in history] == [(0, "WRITE"), (1, "WRITE")]


def test_tables_are_visible_by_name_from_another_process(spark, cfg, env):
    path = cfg.table_path("gold", "device_sessions")
    spark.range(4).write.format("delta").save(path)
    code = ("from common.config import load_config; from common.spark import build_spark;"
            "s = build_spark(load_config());"
            "print('COUNT', s.table('gold.device_sessions').count())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert "COUNT 4" in out.stdout, out.stderr[-2000:]


@pytest.mark.kafka
def test_kafka_round_trip_through_real_broker(spark, kafka_broker):
    from confluent_kafka import Producer

    from common.kafka import ensure_topic

    topic = "roundtrip"
    ensure_topic(kafka_broker.bootstrap, topic, partitions=2)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "enable.idempotence": True})
    sent = [json.dumps({"n": i}) for i in range(100)]
    for i, value in enumerate(sent):
        producer.produce(topic, key=str(i % 7), value=value)
    assert producer.flush(30) == 0

    rows = (spark.read.format("kafka")
            .option("kafka.bootstrap.servers", kafka_broker.bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest").option("endingOffsets", "latest")
            .load().selectExpr("CAST(value AS STRING) AS v", "partition", "offset").collect())
    assert sorted(r.v for r in rows) == sorted(sent)
    assert {r.partition for r in rows} == {0, 1}
