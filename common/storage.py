"""Where the lakehouse lives: a local folder or an object store (`s3a://bucket/prefix`).

Spark reads and writes every path through Hadoop's FileSystem API (s3a:// with the jars from
.cache/jars/s3a). The few things Python does itself (check that a table has a Delta log, read a
checkpoint's offset log, write landing files, hold a checkpoint lock) go through `location()`:
a `pathlib.Path` for a local path, an `ObjectPath` for s3a://, which offers the same small set
of methods over the S3 API (pyarrow's S3 client, configured from conf `object_store`, with the
credentials the AWS SDK finds in the environment).
"""
from __future__ import annotations

import os
import posixpath
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Union

from common.errors import JobError

SCHEME = "s3a://"
UNSUPPORTED = ("s3://", "s3n://", "gs://", "abfs://", "abfss://", "hdfs://", "file://")


class StorageError(JobError):
    """A path the lakehouse cannot use, or an object store it cannot reach."""


@dataclass(frozen=True)
class Store:
    """How to reach the object store (conf `object_store`); no credentials here, ever."""
    endpoint: str | None = None
    region: str = "us-east-1"
    path_style_access: bool = True

    def filesystem(self):
        return _filesystem(self)


_FILESYSTEMS: dict[tuple, object] = {}
CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def _filesystem(store: Store):
    # Keyed by the environment's credentials too: a client built before they changed (tests
    # start servers with fresh keys) would sign with the old ones.
    key = (store, *(os.environ.get(k) for k in CREDENTIALS))
    if key not in _FILESYSTEMS:
        from pyarrow import fs

        kwargs = {"region": store.region, "force_virtual_addressing": not store.path_style_access}
        if store.endpoint:
            scheme, _, host = store.endpoint.partition("://")
            if not host:
                scheme, host = "https", store.endpoint
            kwargs.update(endpoint_override=host.rstrip("/"), scheme=scheme)
        # No keys passed: the AWS SDK's default chain reads AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY
        # (or a profile, or instance credentials), as Spark's s3a connector does.
        _FILESYSTEMS[key] = fs.S3FileSystem(**kwargs)
    return _FILESYSTEMS[key]


@dataclass(frozen=True)
class ObjectPath:
    """`s3a://bucket/key` with the subset of pathlib.Path the lakehouse uses."""
    bucket: str
    key: str = ""
    store: Store = field(default_factory=Store, compare=False)

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}" if self.key else f"{SCHEME}{self.bucket}"

    def __truediv__(self, part) -> "ObjectPath":
        key = posixpath.normpath(posixpath.join(self.key, str(part))).strip("/")
        return ObjectPath(self.bucket, "" if key == "." else key, self.store)

    @property
    def name(self) -> str:
        return posixpath.basename(self.key)

    @property
    def suffix(self) -> str:
        return posixpath.splitext(self.name)[1]

    @property
    def stem(self) -> str:
        return posixpath.splitext(self.name)[0]

    @property
    def parent(self) -> "ObjectPath":
        return ObjectPath(self.bucket, posixpath.dirname(self.key), self.store)

    def with_name(self, name: str) -> "ObjectPath":
        return self.parent / name

    def with_suffix(self, suffix: str) -> "ObjectPath":
        return self.parent / (self.stem + suffix)

    # -- the S3 API ------------------------------------------------------------------------
    @property
    def _fs(self):
        return self.store.filesystem()

    @property
    def _at(self) -> str:
        return f"{self.bucket}/{self.key}" if self.key else self.bucket

    def _info(self):
        try:
            return self._fs.get_file_info(self._at)
        except OSError as e:
            raise StorageError(f"{self}: {e}") from None

    def exists(self) -> bool:
        from pyarrow.fs import FileType

        return self._info().type != FileType.NotFound

    def is_dir(self) -> bool:
        from pyarrow.fs import FileType

        return self._info().type == FileType.Directory

    def is_file(self) -> bool:
        from pyarrow.fs import FileType

        return self._info().type == FileType.File

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Object stores have no folders: a prefix exists once an object is under it."""

    def read_bytes(self) -> bytes:
        try:
            with self._fs.open_input_stream(self._at) as f:
                return f.read()
        except FileNotFoundError:
            raise FileNotFoundError(str(self)) from None

    def read_text(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self.read_bytes().decode(encoding, errors)

    def write_bytes(self, data: bytes) -> None:
        # One PUT: readers see the whole object or none of it (no temp name needed).
        with self._fs.open_output_stream(self._at, metadata={}) as f:
            f.write(data)

    def write_text(self, text: str, encoding: str = "utf-8") -> None:
        self.write_bytes(text.encode(encoding))

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self._fs.delete_file(self._at)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def remove_tree(self) -> None:
        """Delete every object under this prefix."""
        self._fs.delete_dir(self._at)

    def iterdir(self) -> Iterator["ObjectPath"]:
        from pyarrow.fs import FileSelector

        for info in self._fs.get_file_info(FileSelector(self._at, allow_not_found=True)):
            yield self / posixpath.basename(info.path)

    def walk_files(self) -> Iterator[tuple[str, int]]:
        """(path relative to self, size) of every object under this prefix."""
        from pyarrow.fs import FileSelector, FileType

        for info in self._fs.get_file_info(FileSelector(self._at, recursive=True, allow_not_found=True)):
            if info.type == FileType.File:
                yield info.path[len(self._at) + 1:], info.size


Location = Union[Path, ObjectPath]
_default_store = Store()


def set_default_store(store: Store) -> None:
    """The store `location()` binds s3a:// strings to (the loaded config's)."""
    global _default_store
    _default_store = store


def parse(path: str, base: Path | None = None, store: Store | None = None) -> Location:
    """A path from conf or the environment: s3a:// stays a URI, anything else is a local path
    (relative to base, or the working folder)."""
    text = str(path)
    if text.startswith(SCHEME):
        bucket, _, key = text[len(SCHEME):].partition("/")
        if not bucket:
            raise StorageError(f"{text}: no bucket name after {SCHEME}")
        return ObjectPath(bucket, key.strip("/"), store or _default_store)
    for other in UNSUPPORTED:
        if text.startswith(other):
            raise StorageError(f"{text}: {other} paths are not supported; use a local path or "
                               f"{SCHEME}bucket/prefix (object_store in conf/lakehouse.yaml)")
    p = Path(os.path.expanduser(text))
    return (p if p.is_absolute() else (base or Path.cwd()) / p).resolve()


def location(path) -> Location:
    """Path or ObjectPath for a path as Spark knows it (a str from cfg.table_path...)."""
    if isinstance(path, (Path, ObjectPath)):
        return path
    return parse(str(path))


def is_object_store(path) -> bool:
    return isinstance(location(path), ObjectPath)


def is_delta_table(path) -> bool:
    """Whether path holds a Delta table: a _delta_log with a commit or a checkpoint in it. A
    process killed while creating a table leaves the folder and a _delta_log holding no commit
    (Delta makes its _staged_commits folder first), which Delta refuses to read as a table:
    counted as one, it failed every restart that registered or read it."""
    log = location(path) / "_delta_log"
    if not log.is_dir():
        return False
    return any(_is_log_entry(p.name) for p in log.iterdir())


def remove_uncommitted_log(path) -> bool:
    """Delete the _delta_log a killed table creation left without a commit; True if there was
    one. Delta reads such a folder as a table that exists yet cannot be found, so creating the
    table there fails (DELTA_TABLE_NOT_FOUND) on every restart. Nothing is lost: no commit, no
    table."""
    log = location(path) / "_delta_log"
    if not log.is_dir() or is_delta_table(path):
        return False
    if isinstance(log, ObjectPath):
        log.remove_tree()
    else:
        shutil.rmtree(log, ignore_errors=True)
    return True


def _is_log_entry(name: str) -> bool:
    # Delta writes a commit to a hidden temporary file first (".<version>.json.<uuid>.tmp").
    return not name.startswith(".") and (name.endswith(".json") or ".checkpoint" in name
                                         or name == "_last_checkpoint")


def write_atomic(path: Location, data: bytes) -> None:
    """Write a file that readers (Spark's file source) see whole or not at all."""
    if isinstance(path, ObjectPath):
        path.write_bytes(data)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    # The leading dot hides the partial file from Spark's file source until the rename.
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def walk_files(path: Location) -> Iterator[tuple[str, int]]:
    """(relative path, size) of every file under path, local or on the object store."""
    if isinstance(path, ObjectPath):
        yield from path.walk_files()
        return
    for folder, _, files in os.walk(path):
        for f in files:
            full = os.path.join(folder, f)
            try:
                yield os.path.relpath(full, path), os.path.getsize(full)
            except FileNotFoundError:  # removed while we walked (VACUUM, checkpoint cleanup)
                pass
