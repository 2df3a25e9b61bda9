"""Logging for every job and tool, configured once per process.

    level   --log-level on `lakehouse`, else env LOG_LEVEL (DEBUG, INFO, WARNING, ERROR); INFO
    format  plain: `2026-03-01T12:04:05.123Z <message>`, the level written as a prefix when it is
            not INFO (`... error: checkpoint ... in use`), so a line reads as it did before logging
            with a UTC timestamp in front; --log-json / LOG_JSON=1: one JSON object per line with
            time, level, logger, message and the record's structured fields (see `fields`).

INFO and DEBUG go to stdout, WARNING and above to stderr, as the jobs printed them before; each
line is flushed as it is written (a kill -9 must not eat a lease message). The streams are looked
up per line, so pytest's capture and contextlib.redirect_* see them. Our packages log at the chosen
level; other libraries (py4j, GX) only from WARNING up, so --log-level DEBUG stays readable.

Level and format come from the command line and the environment, not conf/: they must be known
before the config is loaded, to report a broken config.

Output that IS a tool's result (sql tables, status and audit reports, --json documents, `s3 env`
exports) is not logging: those tools print it to stdout as plain text.
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from pathlib import Path

from common.errors import JobError

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# Top-level packages whose loggers follow --log-level (module loggers are named by module).
PACKAGES = ("common", "tools", "pipeline", "bronze", "silver", "gold", "audit", "chaos", "bench", "console")
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")

_handler: logging.Handler | None = None


class LogConfigError(JobError, ValueError):
    pass


def stamp(created: float) -> str:
    """UTC, milliseconds: `2026-03-01T12:04:05.123Z` (the watermarks in batch lines are UTC too)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created % 1 * 1000):03d}Z"


def fields(**values) -> dict:
    """`extra=` for a record's structured fields: `log.info(text, extra=fields(rows=12))`."""
    return {"fields": values}


def message_of(line: str) -> str:
    """A plain log line without its timestamp: what code that reads job logs matches against."""
    return STAMP.sub("", line, count=1)


def parseable_env(env: dict) -> dict:
    """Environment for a child job whose output the caller reads line by line (chaos, bench):
    plain lines, and at least INFO, so batch and layer lines are there to match."""
    out = dict(env)
    out["LOG_JSON"] = "0"
    if str(out.get("LOG_LEVEL", "")).upper() != "DEBUG":
        out["LOG_LEVEL"] = "INFO"
    return out


class PlainFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.levelno != logging.INFO:
            text = f"{record.levelname.lower()}: {text}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return f"{stamp(record.created)} {text}"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"time": stamp(record.created), "level": record.levelname, "logger": record.name,
               "message": record.getMessage()}
        for key, value in (getattr(record, "fields", None) or {}).items():
            doc.setdefault(key, value)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def ours_or_warning(record: logging.LogRecord) -> bool:
    """Our own records at the configured level; another library's only from WARNING up, even
    when it sets its own logger to INFO (GX announces every temporary docs folder it makes)."""
    return record.levelno >= logging.WARNING or record.name.split(".", 1)[0] in PACKAGES


class ConsoleHandler(logging.Handler):
    """INFO and below to the current sys.stdout, WARNING up to sys.stderr; flushed per line."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - logging's own policy: report, never raise into the job
            self.handleError(record)


def settings(level: str | None = None, json_lines: bool | None = None, env=None) -> tuple[str, bool]:
    """The level and format to use: the arguments where given, else LOG_LEVEL / LOG_JSON."""
    env = os.environ if env is None else env
    level = (level or env.get("LOG_LEVEL") or "INFO").upper()
    if level not in LEVELS:
        raise LogConfigError(f"log level {level!r} (LOG_LEVEL / --log-level): expected one of {', '.join(LEVELS)}")
    if json_lines is None:
        raw = str(env.get("LOG_JSON", "")).strip().lower()
        if raw not in _TRUE + _FALSE:
            raise LogConfigError(f"LOG_JSON={raw!r}: expected 1 or 0")
        json_lines = raw in _TRUE
    return level, json_lines


def configure(level: str | None = None, json_lines: bool | None = None, force: bool = False) -> None:
    """Set up logging for this process. The first call wins (the `lakehouse` group makes it with
    its options, the tools' mains then find it done) unless force. A bad LOG_LEVEL/LOG_JSON exits 2."""
    global _handler
    if _handler is not None and not force:
        return
    try:
        level, json_lines = settings(level, json_lines)
    except LogConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    _handler = ConsoleHandler()
    _handler.addFilter(ours_or_warning)
    _handler.setFormatter(JsonFormatter() if json_lines else PlainFormatter())
    root.addHandler(_handler)
    root.setLevel(max(logging.WARNING, logging.getLevelName(level)))
    for name in PACKAGES:
        logging.getLogger(name).setLevel(level)


class LogToFile:
    """From now until close(), log lines go to `path` (appended) instead of the console, in the
    same format: the soak keeps the pipeline's lines in pipeline.log and prints one line per sample."""

    def __init__(self, path: Path):
        configure()
        self.console = _handler
        self.file = logging.FileHandler(path, mode="a", encoding="utf-8")   # flushes every record
        self.file.addFilter(ours_or_warning)
        self.file.setFormatter(self.console.formatter)
        root = logging.getLogger()
        root.removeHandler(self.console)
        root.addHandler(self.file)

    def close(self) -> None:
        root = logging.getLogger()
        if self.file in root.handlers:
            root.removeHandler(self.file)
            root.addHandler(self.console)
        self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
