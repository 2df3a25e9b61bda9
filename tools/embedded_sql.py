"""Read-only SQL over the lakehouse's Delta tables in this process, without a JVM.

delta-rs (`deltalake`) reads each Delta table the query names, at its latest version or at the
one `VERSION AS OF n` / `TIMESTAMP AS OF '...'` asks for; DuckDB runs the query. The query is
Spark SQL: sqlglot rewrites it into DuckDB's dialect, which keeps Spark's meaning where the two
differ (`/` is always a fractional division, `date_format` patterns, `collect_list`, ...).

Catalog names are resolved as common.catalog does for Spark: `<layer>.<table>` is
`cfg.table_path(layer, table)`, local or s3a:// (conf object_store, credentials from the
environment). Anything this engine cannot run raises Unsupported, and tools.sql runs that
statement on Spark instead.
"""
from __future__ import annotations

import logging
import os
from datetime import datetime, timezone

from common.config import Config
from common.errors import JobError


class Unsupported(Exception):
    """A statement this engine cannot run, but Spark may (DDL/DML, syntax or a function it lacks,
    a table protocol delta-rs cannot read)."""


class QueryError(JobError):
    """A statement no engine can run: an unknown table, a version the table does not have."""


# Spark's catalog also answers to its session catalog's name in front of the layer.
SESSION_CATALOG = "spark_catalog"


def storage_options(cfg: Config) -> dict[str, str]:
    """delta-rs' object store settings for an s3a:// root: conf object_store, and the credentials
    the environment holds (as Spark's s3a connector finds them there)."""
    if not cfg.on_object_store:
        return {}
    store = cfg.store
    opts = {"AWS_REGION": store.region,
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": str(not store.path_style_access).lower()}
    if store.endpoint:
        opts["AWS_ENDPOINT_URL"] = store.endpoint if "://" in store.endpoint else f"https://{store.endpoint}"
        opts["AWS_ALLOW_HTTP"] = str(opts["AWS_ENDPOINT_URL"].startswith("http://")).lower()
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        if os.environ.get(var):
            opts[var] = os.environ[var]
    return opts


def table_uri(path: str) -> str:
    # delta-rs names the S3 scheme s3://; Spark's s3a:// is the same bucket and key.
    return "s3://" + path[len("s3a://"):] if path.startswith("s3a://") else path


class EmbeddedEngine:
    """One DuckDB connection; each query registers the Delta snapshots it reads."""

    def __init__(self, cfg: Config):
        import duckdb

        self.cfg = cfg
        self._options = storage_options(cfg)
        # No extension is ever fetched at query time: a query that needs one fails here and
        # runs on Spark instead. Spark's session time zone is UTC (common.spark), so is ours.
        self.con = duckdb.connect(config={"autoinstall_known_extensions": False,
                                          "autoload_known_extensions": False})
        self.con.execute("SET TimeZone = 'UTC'")
        self._snapshots: dict[tuple, str] = {}
        logging.getLogger("sqlglot").setLevel(logging.ERROR)

    def query(self, sql: str, limit: int) -> tuple[list[str], list[tuple]]:
        """Columns and at most `limit` rows of one read-only Spark SQL statement."""
        import duckdb

        text = self.translate(sql)
        try:
            cur = self.con.execute(text)
            rows = cur.fetchmany(limit)
        except duckdb.Error as e:
            raise Unsupported(f"DuckDB: {_first_line(e)}") from None
        return [d[0] for d in cur.description], [tuple(map(spark_value, r)) for r in rows]

    def translate(self, sql: str) -> str:
        """The statement in DuckDB's dialect, every lakehouse table replaced by its snapshot."""
        import sqlglot
        from sqlglot import exp

        try:
            trees = [t for t in sqlglot.parse(sql, read="spark") if t is not None]
        except sqlglot.errors.SqlglotError as e:
            raise Unsupported(f"cannot parse it: {_first_line(e)}") from None
        if len(trees) != 1:
            raise Unsupported(f"expected one statement, got {len(trees)}")
        tree = trees[0]
        if not isinstance(tree, exp.Query):
            kind = tree.key.upper() if not isinstance(tree, exp.Command) else str(tree.this).upper()
            raise Unsupported(f"{kind} is not a read-only query")
        _name_like_spark(tree)
        for node in list(tree.find_all(exp.Table)):
            layer = node.db.lower()
            if layer in self.cfg.tables and node.catalog.lower() in ("", SESSION_CATALOG):
                self._replace(node, layer, node.name)
        try:
            return tree.sql(dialect="duckdb")
        except sqlglot.errors.SqlglotError as e:
            raise Unsupported(f"cannot translate it: {_first_line(e)}") from None

    def _replace(self, node, layer: str, table: str) -> None:
        from sqlglot import exp

        try:
            self.cfg.table_name(layer, table)
        except KeyError as e:
            raise QueryError(e.args[0]) from None
        as_of = _as_of(node.args.get("version"), f"{layer}.{table}")
        name = self._snapshot(layer, table, as_of)
        alias = node.args.get("alias") or exp.TableAlias(this=exp.to_identifier(table))
        node.replace(exp.Table(this=exp.to_identifier(name), alias=alias))

    def _snapshot(self, layer: str, table: str, as_of) -> str:
        """Register the table at `as_of` (None: latest) once per engine; its name in DuckDB."""
        key = (layer, table, as_of)
        if key not in self._snapshots:
            from deltalake import DeltaTable, QueryBuilder
            from deltalake.exceptions import DeltaError, DeltaProtocolError, TableNotFoundError

            full = f"{layer}.{table}"
            path = self.cfg.table_path(layer, table)
            try:
                dt = DeltaTable(table_uri(path), storage_options=self._options)
                if isinstance(as_of, int):
                    if as_of > dt.version():
                        raise QueryError(f"{full} has no version {as_of}: its latest is {dt.version()}")
                    dt.load_as_version(as_of)
                elif as_of is not None:
                    dt.load_as_version(as_of)
                # Materialised (not streamed) so DuckDB may scan it more than once (self-joins).
                data = QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all()
            except TableNotFoundError:
                raise QueryError(f"table {full} does not exist yet: no Delta table at {path}") from None
            except DeltaProtocolError as e:
                raise Unsupported(f"delta-rs cannot read {full} ({_first_line(e)})") from None
            except DeltaError as e:
                if as_of is not None:
                    raise QueryError(f"{full} cannot be read as of {as_of}: {_first_line(e)}") from None
                raise Unsupported(f"delta-rs cannot read {full} ({_first_line(e)})") from None
            except QueryError:
                raise
            except Exception as e:   # noqa: BLE001 - delta-rs and Arrow raise plain errors on data they refuse
                raise Unsupported(f"delta-rs cannot read {full} ({type(e).__name__}: {_first_line(e)})") from None
            name = f"{layer}__{table}" + ("" if as_of is None else f"__{len(self._snapshots)}")
            self.con.register(name, data)
            self._snapshots[key] = name
        return self._snapshots[key]


def _as_of(version, table: str):
    """None, a version number, or an aware datetime from a parsed `VERSION|TIMESTAMP AS OF`."""
    from sqlglot import exp

    if version is None:
        return None
    kind, value = str(version.this).upper(), version.args.get("expression")
    if version.text("kind").upper() != "AS OF" or not isinstance(value, exp.Literal):
        raise Unsupported(f"{table}: only VERSION AS OF <n> and TIMESTAMP AS OF '<timestamp>' are supported")
    if kind == "VERSION":
        if value.is_string or not str(value.this).isdigit():
            raise QueryError(f"{table}: VERSION AS OF needs a version number, got {value.sql()}")
        return int(str(value.this))
    try:
        ts = datetime.fromisoformat(str(value.this).replace("Z", "+00:00"))
    except ValueError:
        raise QueryError(f"{table}: TIMESTAMP AS OF needs a timestamp like '2026-11-01 10:00:00', "
                         f"got {value.sql()}") from None
    # A timestamp without a zone is in Spark's session time zone, UTC (common.spark).
    return ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)


def _name_like_spark(tree) -> None:
    """Alias each unnamed result expression with the name Spark gives it (`count(1)`,
    `round((duration_seconds / 60), 1)`), where DuckDB would say `count_star()`."""
    from sqlglot import exp

    for proj in list(tree.selects):
        if isinstance(proj, (exp.Alias, exp.Column, exp.Star, exp.Literal)):
            continue
        name = exp.Paren(this=proj.copy())  # a parent, so the root is replaced like the rest
        for paren in list(name.this.find_all(exp.Paren)):
            paren.replace(paren.this)
        # Spark parenthesises every binary operator; innermost first, so each copy holds its own.
        for binary in reversed(list(name.find_all(exp.Binary, bfs=False))):
            binary.replace(exp.Paren(this=binary.copy()))
        text = name.this.sql(dialect="spark", normalize_functions="lower").replace("count(*)", "count(1)")
        proj.replace(exp.alias_(proj.copy(), text, quoted=True))


def spark_value(v):
    """A DuckDB result value as pyspark's collect() gives it, so both print alike: a zoned
    timestamp becomes a naive local one (pyspark converts TIMESTAMP to the process's zone)."""
    if isinstance(v, datetime) and v.tzinfo is not None:
        return v.astimezone().replace(tzinfo=None)
    if isinstance(v, list):
        return [spark_value(x) for x in v]
    return v


def _first_line(e: Exception) -> str:
    return str(e).strip().split("\n")[0]
