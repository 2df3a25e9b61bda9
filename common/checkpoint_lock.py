"""One process per checkpoint: two on one checkpoint would race on its offset log and corrupt it.

A local checkpoint is locked with flock(), which dies with the process: a crashed job never
leaves a stale lock. Object stores have no locks, so a checkpoint on s3a:// is held by a lease
object beside it, `<query>.lease`: its owner and an expiry `object_store.lease_ttl` ahead,
renewed every third of the ttl while the process runs, deleted when it stops. A starting
instance that finds a lease watches it: renewed, its holder is alive and the start is refused
(within a third of the ttl); not renewed until it expires, its holder died (kill -9) and the
lease is taken over (a restart waits at most one ttl). A holder that ran on this machine
needs no watching: the lease names its process (the kernel's boot, pid namespace, user, pid and
start time) and the children it had when it last wrote the lease, and every process it starts
after taking the lease carries its name in its environment: its JVM, which writes the
checkpoint, is one or the other. When none of them runs any more, the lease is taken over at once,
or, when one still ran as the start looked (a JVM still dying after a kill -9), as soon as none does.
Two instances starting at the same moment both write
their lease; each waits `lease_settle`, reads it back, and only the one whose write landed last
goes on (S3 reads are strongly consistent since 2020). Expiry is judged by the wall clock, so
machines that share a bucket need synchronised clocks (NTP).
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path

from common.config import Config
from common.log import fields
from common.storage import ObjectPath, location
from common.errors import JobError

# Lease messages are logged as they happen, each line flushed (common.log): when a job is killed
# with -9 right after, its log must still say whose lease it waited for.
log = logging.getLogger(__name__)


class CheckpointBusy(JobError):
    """Another instance holds the checkpoint (message names the holder; `holder` alone, for a
    caller that waits for it rather than refusing)."""

    def __init__(self, message: str, holder: str = ""):
        super().__init__(message)
        self.holder = holder


def _refusal(path, holder: str) -> CheckpointBusy:
    return CheckpointBusy(f"checkpoint {path} is in use by {holder}: another instance of this job is "
                          f"running; stop it first", holder)


class _FileLock:
    def __init__(self, path):
        self.path, self.file = path, None

    def acquire(self) -> None:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise _refusal(self.path.with_suffix(""), holder) from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        f.flush()
        self.file = f

    def renew(self) -> None:
        pass

    def release(self) -> None:
        if self.file:
            self.file.close()
            self.file = None


# Names the lease holders among a process's ancestors, so a holder's descendants are found.
HOLDERS_VAR = "LAKEHOUSE_LEASE_HOLDERS"


def _process(pid: int) -> dict | None:
    """What names a process on this machine across time: the kernel's boot, the pid namespace,
    the user, the pid and its start (clock ticks since boot; a reused pid has a later one). None
    where /proc does not say (not Linux, or no such process)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink(f"/proc/{pid}/ns/pid")
        uid = os.stat(f"/proc/{pid}").st_uid
        start = _stat(str(pid))[1]
    except (OSError, ValueError, IndexError):
        return None
    return {"boot": boot, "pid_namespace": namespace, "uid": uid, "pid": pid, "start": start}


def _stat(pid: str) -> tuple[int, int]:
    """(parent pid, start) of a process, from /proc/<pid>/stat. The command name (field 2) may
    hold spaces and parentheses: the fields are counted from its end."""
    fields_ = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields_[1]), int(fields_[19])


def _processes():
    """/proc's folder of every process of this machine."""
    return (proc for proc in Path("/proc").iterdir() if proc.name.isdigit())


def _children(pid: int) -> list[dict]:
    """This machine's processes whose parent is `pid`, each {"pid", "start"}."""
    out = []
    for proc in _processes():
        try:
            parent, start = _stat(proc.name)
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid:
            out.append({"pid": int(proc.name), "start": start})
    return out


def _token(process: dict) -> str:
    return f"{process['pid']}-{process['start']}"


def _mark_descendants(process: dict | None) -> None:
    """Processes started from now on (the JVM, its workers) carry this holder's name."""
    if process is not None:
        held = [t for t in os.environ.get(HOLDERS_VAR, "").split(",") if t]
        if _token(process) not in held:
            os.environ[HOLDERS_VAR] = ",".join([*held, _token(process)])


def _descendant_running(token: str) -> bool:
    """A process of this machine started with `token` among its holders (environments of other
    users' processes are not readable, and are not a holder's descendants)."""
    needle = f"{HOLDERS_VAR}=".encode()
    for proc in _processes():
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        for entry in environ.split(b"\0"):
            if entry.startswith(needle) and token in entry[len(needle):].decode(errors="replace").split(","):
                return True
    return False


def _running(pid: int, start: int) -> bool:
    try:
        return _stat(str(pid))[1] == start
    except (OSError, ValueError, IndexError):
        return False


def _gone(holder: dict | None, here: dict | None) -> bool:
    """The lease's holder ran on this machine (this boot, pid namespace and user), and neither it,
    nor a child it had when it wrote the lease, nor any process it started since runs any more.
    A holder elsewhere, or any doubt, is not gone."""
    keys = ("boot", "pid_namespace", "uid")
    if not isinstance(holder, dict) or not here or any(holder.get(k) != here[k] for k in keys):
        return False
    try:
        known = [(int(p["pid"]), int(p["start"])) for p in [holder, *holder.get("children", [])]]
    except (KeyError, TypeError, ValueError):
        return False
    if any(_running(pid, start) for pid, start in known):
        return False
    return not _descendant_running(_token(holder))


GONE = "which no longer runs on this machine"


class _Lease:
    def __init__(self, path: ObjectPath, ttl: float, settle: float):
        self.path, self.ttl, self.settle = path, ttl, settle
        self.owner = f"pid {os.getpid()} on {socket.gethostname()} ({uuid.uuid4().hex[:8]})"
        self.process = _process(os.getpid())
        self.held = False

    def _read(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except ValueError:  # a torn or foreign object: treat it as expired
            return {}

    def _write(self) -> None:
        # Children already running (a JVM started before the lease was taken) do not carry the
        # holder's name: the lease lists them, as they are at each write.
        process = self.process and {**self.process, "children": _children(self.process["pid"])}
        self.path.write_text(json.dumps({
            "owner": self.owner, "expires": time.time() + self.ttl, "process": process,
            "renewed": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}))

    def _other(self, lease: dict | None) -> bool:
        """Whether `lease` names a holder other than this one."""
        return bool(lease) and lease.get("owner") not in (None, self.owner)

    def _takeover(self, lease: dict | None) -> str | None:
        """Why another holder's lease may be taken over at once (for the log), or None."""
        if not self._other(lease):
            return None
        left = float(lease.get("expires", 0)) - time.time()
        if left <= 0:
            return f"expired {-left:.0f} s ago"
        if _gone(lease.get("process"), self.process):
            return GONE
        return None

    def _log_takeover(self, lease: dict, why: str) -> None:
        log.info(f"checkpoint {self.path.with_suffix('')}: lease held by {lease['owner']}, {why}: taken over",
                 extra=fields(event="lease_takeover", lease=str(self.path), holder=lease["owner"]))

    def acquire(self) -> None:
        lease = self._read()
        taken = self._takeover(lease)
        if taken:
            self._log_takeover(lease, taken)
        elif self._other(lease):      # live, or dead elsewhere
            # Live or dead? A running holder renews within a third of the ttl; one killed with -9
            # never will. Watch it until it expires (at most one ttl) and refuse if it is renewed.
            expires = float(lease["expires"])
            log.info(f"checkpoint {self.path.with_suffix('')}: lease held by {lease['owner']}; waiting up to "
                     f"{expires - time.time():.0f} s to see whether it is renewed",
                     extra=fields(event="lease_wait", lease=str(self.path), holder=lease["owner"]))
            while time.time() < expires + self.settle:
                time.sleep(min(1.0, max(0.05, expires + self.settle - time.time())))
                now = self._read()
                if now is None:       # released as we watched
                    break
                if now.get("owner") != lease["owner"] or float(now.get("expires", 0)) != expires:
                    holder = now.get("owner", "another process")
                    raise _refusal(self.path.with_suffix(""), f"{holder} (it renews its lease)")
                # A holder of this machine killed just before (a crash, then an immediate restart)
                # can still be dying when the start looks: its JVM tearing down gigabytes of heap,
                # or dead and not yet reaped. Gone since, it need not be watched until expiry.
                if _gone(lease.get("process"), self.process):
                    self._log_takeover(lease, GONE)
                    break
        self._write()
        time.sleep(self.settle)
        lease = self._read() or {}
        if lease.get("owner") != self.owner:
            raise _refusal(self.path.with_suffix(""), f"{lease.get('owner', 'another process')} "
                                                      f"(it took the lease as this one started)")
        self.held = True
        _mark_descendants(self.process)

    def renew(self) -> None:
        if not self.held:
            return
        lease = self._read() or {}
        if lease.get("owner") != self.owner:
            self.held = False
            raise CheckpointBusy(f"lost the lease {self.path} to {lease.get('owner', 'nobody')}: it expired "
                                 f"before this process renewed it (object store unreachable for a ttl?)")
        self._write()

    def release(self) -> None:
        if self.held and (self._read() or {}).get("owner") == self.owner:
            self.path.unlink(missing_ok=True)
        self.held = False


class CheckpointLocks:
    """Exclusive hold on the queries' checkpoints while a job runs (flock locally, a lease on
    object storage). Raises CheckpointBusy, naming the holder, if any is taken."""

    def __init__(self, cfg: Config, queries):
        o = cfg.object_store
        self.locks = []
        queries = list(queries)
        for q in queries:
            checkpoint = location(cfg.checkpoint(q))
            if isinstance(checkpoint, ObjectPath):
                self.locks.append(_Lease(checkpoint.with_name(f"{q}.lease"), o.lease_ttl.seconds,
                                         o.lease_settle.seconds))
            else:
                self.locks.append(_FileLock(checkpoint.with_name(f"{q}.lock")))
        self.leases = [lock for lock in self.locks if isinstance(lock, _Lease)]
        self.by_query = dict(zip(queries, self.locks))
        self._stop = threading.Event()
        self._renewer = None

    def __enter__(self):
        try:
            for lock in self.locks:
                lock.acquire()
        except BaseException:
            self.__exit__()
            raise
        if self.leases:
            self._renewer = threading.Thread(target=self._renew, name="checkpoint-lease", daemon=True)
            self._renewer.start()
        return self

    def _renew(self) -> None:
        period = min(lease.ttl for lease in self.leases) / 3
        while not self._stop.wait(period):
            for lease in self.leases:
                try:
                    lease.renew()
                except CheckpointBusy as e:
                    log.error(str(e))
                except Exception as e:  # the store may be briefly unreachable: try again next period
                    log.warning(f"renewing {lease.path} failed ({e}); retrying in {period:.0f} s")

    def lend(self, query: str) -> None:
        """Let go of one query's checkpoint while the others stay held (pipeline/handover.py)."""
        self.by_query[query].release()

    def take_back(self, query: str) -> None:
        """Hold it again; CheckpointBusy while another process still does."""
        self.by_query[query].acquire()

    def __exit__(self, *exc):
        self._stop.set()
        if self._renewer:
            self._renewer.join()
            self._renewer = None
        for lock in self.locks:
            try:
                lock.release()
            except Exception:  # an expired lease is as good as released
                pass


def _flocked(path: Path) -> bool | None:
    """Whether a process holds a flock on `path` now, read from the kernel's lock table without
    taking the lock (a probe that took it, even shared, could refuse a job starting that moment).
    None where there is no /proc/locks to read."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    try:
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    # "1: FLOCK  ADVISORY  WRITE 7673 fe:00:9978158 0 EOF": device major:minor in hex, inode.
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino} "
    return any(line.split()[1:2] == ["FLOCK"] and inode in line for line in table.splitlines())


def held(cfg: Config, query: str) -> bool | None:
    """Whether a process holds the query's checkpoint now (None: this machine cannot tell). A run
    the progress log calls running whose checkpoint nobody holds has died without recording its
    end (kill -9, out of memory, the machine stopped): `make status` says so."""
    checkpoint = location(cfg.checkpoint(query))
    if isinstance(checkpoint, ObjectPath):
        lease = _Lease(checkpoint.with_name(f"{query}.lease"), 0, 0)._read()
        return _live(lease, _process(os.getpid()))
    return _flocked(checkpoint.with_name(f"{query}.lock"))


def _live(lease: dict | None, here: dict | None) -> bool:
    return bool(lease) and float(lease.get("expires", 0)) > time.time() and not _gone(lease.get("process"), here)


def live_leases(cfg: Config) -> list[str]:
    """Holders of the unexpired leases under the checkpoint root (object storage only): a pipeline
    running there is the one driver Delta's S3 log store allows to write its tables. A lease
    whose holder is gone from this machine (_gone) holds nothing."""
    root = location(str(cfg.checkpoint_root))
    if not isinstance(root, ObjectPath):
        return []
    live, here = [], _process(os.getpid())
    for obj in root.iterdir():
        if obj.suffix == ".lease":
            lease = _Lease(obj, 0, 0)._read()
            if _live(lease, here):
                live.append(f"{obj.stem} ({lease.get('owner')})")
    return live
