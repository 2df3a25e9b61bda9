"""A local S3-compatible server (S3Proxy, filesystem backend), run from the jar Maven fetched at
setup, for object-store runs and tests without a cloud account.

`python -m tools.s3_server up|down|status|env` backs `make s3-up/-down/-status`; tests use
`S3Server` directly on free ports. It listens on 127.0.0.1 only and keeps its objects under
object_store.server.data_dir (git-ignored), one folder per bucket.

Credentials: the server takes AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY from the environment
when set; otherwise it draws a random pair once and keeps it in <data_dir>/credentials.env
(mode 600). `python -m tools.s3_server env` prints the exports (endpoint, keys, LAKEHOUSE_ROOT=
s3a://<bucket>/nest) that point a shell, and every job started from it, at the server.
"""
from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from common.config import load_config
from common.errors import JobError, command
from common.jars import s3proxy_jar
from tools.processes import live_pid, port_open, terminate
from common.storage import ObjectPath, Store, StorageError


class S3ServerError(JobError):
    pass


@dataclass
class S3Server:
    data_dir: Path
    port: int
    bucket: str
    heap: str = "256m"
    access_key: str = ""
    secret_key: str = ""

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "server.pid"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "server.log"

    @property
    def credentials_file(self) -> Path:
        return self.data_dir / "credentials.env"

    def env(self) -> dict[str, str]:
        """What a job needs in its environment to use this server (S3_ENDPOINT: conf override)."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "S3_ENDPOINT": self.endpoint}

    def uri(self, prefix: str = "") -> str:
        return f"s3a://{self.bucket}/{prefix}".rstrip("/")

    def load_credentials(self, environ=os.environ) -> None:
        """From the environment, else the pair drawn for this data folder, else a new pair."""
        if environ.get("AWS_ACCESS_KEY_ID") and environ.get("AWS_SECRET_ACCESS_KEY"):
            self.access_key, self.secret_key = environ["AWS_ACCESS_KEY_ID"], environ["AWS_SECRET_ACCESS_KEY"]
            return
        if self.credentials_file.is_file():
            values = dict(line.removeprefix("export ").split("=", 1)
                          for line in self.credentials_file.read_text().splitlines() if "=" in line)
            self.access_key = values["AWS_ACCESS_KEY_ID"]
            self.secret_key = values["AWS_SECRET_ACCESS_KEY"]
            return
        self.access_key, self.secret_key = f"local{secrets.token_hex(6)}", secrets.token_urlsafe(30)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.credentials_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"AWS_ACCESS_KEY_ID={self.access_key}\nAWS_SECRET_ACCESS_KEY={self.secret_key}\n")

    def _write_config(self) -> Path:
        objects = self.data_dir / "objects"
        # The filesystem backend maps a bucket to a folder: creating it creates the bucket.
        (objects / self.bucket).mkdir(parents=True, exist_ok=True)
        props = self.data_dir / "s3proxy.properties"
        fd = os.open(props, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # holds the secret
        with os.fdopen(fd, "w") as f:
            f.write("\n".join([
                f"s3proxy.endpoint=http://127.0.0.1:{self.port}",
                "s3proxy.authorization=aws-v2-or-v4",
                f"s3proxy.identity={self.access_key}",
                f"s3proxy.credential={self.secret_key}",
                "jclouds.provider=filesystem-nio2",
                f"jclouds.filesystem.basedir={objects}",
                "",
            ]))
        return props

    def pid(self) -> int | None:
        return live_pid(self.pid_file)

    def start(self, timeout: float = 60.0) -> None:
        if not self.access_key:
            self.load_credentials()
        if self.pid():
            self.wait_ready(timeout)
            return
        if port_open(self.port):
            raise S3ServerError(f"port {self.port} on 127.0.0.1 is already in use by another process; "
                                "set object_store.server.port / S3_PORT to a free one")
        props = self._write_config()
        cmd = ["java", f"-Xmx{self.heap}", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
               "-DLOG_LEVEL=warn", "-jar", s3proxy_jar(), "--properties", str(props)]
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self.pid_file.write_text(str(proc.pid))
        deadline = time.monotonic() + timeout
        while not port_open(self.port):
            if proc.poll() is not None:
                raise S3ServerError(f"the S3 server exited with code {proc.returncode}; see {self.log_file}")
            if time.monotonic() > deadline:
                self.stop()
                raise S3ServerError(f"the S3 server did not listen on {self.endpoint} within {timeout:g}s; "
                                    f"see {self.log_file}")
            time.sleep(0.2)
        self.wait_ready(max(1.0, deadline - time.monotonic()))

    def wait_ready(self, timeout: float) -> None:
        """Return once the bucket answers an authenticated listing."""
        bucket = ObjectPath(self.bucket, "", Store(self.endpoint))
        deadline, last = time.monotonic() + timeout, None
        saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
        os.environ.update(AWS_ACCESS_KEY_ID=self.access_key, AWS_SECRET_ACCESS_KEY=self.secret_key)
        try:
            while time.monotonic() < deadline:
                try:
                    if bucket.is_dir():
                        return
                except (StorageError, OSError) as e:
                    last = e
                time.sleep(0.3)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        raise S3ServerError(f"the S3 server at {self.endpoint} did not serve bucket {self.bucket!r} "
                            f"within {timeout:g}s ({last}); see {self.log_file}")

    def stop(self, timeout: float = 30.0) -> bool:
        pid = self.pid()
        if pid is not None:
            terminate(pid, timeout)
        self.pid_file.unlink(missing_ok=True)
        return pid is not None


def server_from_config(cfg) -> S3Server:
    s = cfg.object_store.server
    data_dir = Path(os.path.expanduser(s.data_dir))
    data_dir = (data_dir if data_dir.is_absolute() else Path.cwd() / data_dir).resolve()
    return S3Server(data_dir=data_dir, port=s.port, bucket=s.bucket, heap=s.heap)


@command
def main(argv: list[str] | None = None, prog: str = "s3_server") -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description="Run the local S3-compatible server (S3Proxy, 127.0.0.1).")
    parser.add_argument("action", choices=["up", "down", "status", "env"],
                        help="env: print the exports that point jobs at the server")
    parser.add_argument("--prefix", default="nest",
                        help="env: the lakehouse root's prefix in the bucket (default nest)")
    args = parser.parse_args(argv)
    cfg = load_config()
    server = server_from_config(cfg)
    if args.action == "up":
        server.start(cfg.object_store.server.start_timeout.seconds)
        print(f"s3 up at {server.endpoint}, bucket {server.bucket} (pid {server.pid()}, "
              f"objects in {server.data_dir / 'objects'}); `eval $(make -s s3-env)` points a shell at it")
    elif args.action == "down":
        print("s3 stopped" if server.stop() else "s3 was not running")
    elif args.action == "env":
        server.load_credentials()
        for k, v in {**server.env(), "LAKEHOUSE_ROOT": server.uri(args.prefix)}.items():
            print(f"export {k}={v}")
    else:
        pid = server.pid()
        if pid is None:
            print(f"s3 down (no server process for {server.data_dir})")
            return 1
        server.load_credentials()
        server.wait_ready(5)
        print(f"s3 up at {server.endpoint}, bucket {server.bucket} (pid {pid})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
