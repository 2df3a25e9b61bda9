"""Small DataFrames of Python rows built as one literal plan: the ops rows every micro-batch
writes (accounting, progress, quality results) and the locations seed.

createDataFrame pickles the rows into an RDD spread over default.parallelism partitions and
starts Python workers to read them; for the few rows of an ops table that costs about as much as
the Delta commit itself. A plan of Column literals avoids that but asks the JVM four times per
cell (lit, the type's parse, cast, alias): 70-125 ms for one accounting or progress row, 290-410
ms for a gate's nine result rows. So the rows are written as one SQL expression, parsed by one
call, with every value rendered at its exact type."""
from __future__ import annotations

import math
from datetime import datetime

from pyspark.sql.types import (BooleanType, DataType, DoubleType, IntegerType, LongType, MapType, StringType,
                               StructType, TimestampType)

MAX_ROWS = 500     # past this a literal plan costs more to analyse than the RDD path

_INTS = {LongType: "BIGINT", IntegerType: "INT"}


class _NotRendered(Exception):
    """A value or type the SQL text does not cover: the frame is built from Column literals."""


def local_frame(spark, rows, schema: StructType):
    """A DataFrame of `rows` (tuples in `schema` order) in one partition, of exactly `schema`'s
    types. A row of another length is an error: the Column path would drop its extra values."""
    width = len(schema.fields)
    for i, row in enumerate(rows):
        if len(row) != width:
            raise ValueError(f"row {i} has {len(row)} values, schema {schema.simpleString()} has {width} fields")
    if not rows or len(rows) > MAX_ROWS:
        return spark.createDataFrame(rows, schema)
    try:
        structs = ", ".join(_row_sql(row, schema) for row in rows)
    except _NotRendered:
        return _column_frame(spark, rows, schema)
    return spark.range(1, numPartitions=1).selectExpr(f"inline(array({structs}))")


def _row_sql(row, schema: StructType) -> str:
    return "named_struct(" + ", ".join(f"{_string(f.name)}, {sql_literal(v, f.dataType)}"
                                       for v, f in zip(row, schema.fields)) + ")"


def sql_literal(value, data_type: DataType) -> str:
    """`value` as a SQL literal of `data_type`, exact: strings as UTF-8 bytes in hex (no escaping,
    and no `${...}` for the parser's variable substitution to find), timestamps as the
    microseconds PySpark's own conversion gives, doubles by their shortest round-trip repr."""
    if value is None:
        return f"CAST(NULL AS {data_type.simpleString()})"
    kind = type(data_type)
    if kind is StringType and isinstance(value, str):
        return _string(value)
    if kind in _INTS and isinstance(value, int) and not isinstance(value, bool):
        return f"CAST({value} AS {_INTS[kind]})"
    if kind is DoubleType and isinstance(value, (int, float)) and not isinstance(value, bool):
        text = "NaN" if math.isnan(value) else repr(float(value)).replace("inf", "Infinity")
        return f"CAST('{text}' AS DOUBLE)"
    if kind is BooleanType and isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if kind is TimestampType and isinstance(value, datetime):
        return f"timestamp_micros({TimestampType().toInternal(value)})"
    if kind is MapType and isinstance(value, dict):
        pairs = ", ".join(f"{sql_literal(k, data_type.keyType)}, {sql_literal(v, data_type.valueType)}"
                          for k, v in value.items())
        return f"CAST(map({pairs}) AS {data_type.simpleString()})"     # the type's nullability too
    raise _NotRendered


def _string(text: str) -> str:
    return f"CAST(X'{text.encode('utf-8').hex()}' AS STRING)"


def _column_frame(spark, rows, schema: StructType):
    from pyspark.sql import functions as F

    structs = [F.struct(*[_column(value, f.dataType).alias(f.name) for value, f in zip(row, schema.fields)])
               for row in rows]
    return spark.range(1, numPartitions=1).select(F.inline(F.array(*structs)))


def _column(value, data_type):
    from pyspark.sql import functions as F

    if value is None:
        return F.lit(None).cast(data_type)
    if isinstance(data_type, MapType):
        if not value:
            return F.create_map().cast(data_type)
        return F.create_map(*[F.lit(x) for kv in value.items() for x in kv]).cast(data_type)
    return F.lit(value).cast(data_type)
