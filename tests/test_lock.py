"""make setup installs the lock: every package of requirements.lock, at the locked version."""
from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")   # Python 3.11+

REPO = Path(__file__).resolve().parent.parent
LOCKED = re.compile(r"^(?P<name>[A-Za-z0-9_.\-]+)==(?P<version>\S+)$")


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lock() -> dict[str, str]:
    lines = [l for l in (REPO / "requirements.lock").read_text().splitlines() if l and not l.startswith("#")]
    pins = {}
    for line in lines:
        m = LOCKED.match(line)
        assert m, f"requirements.lock: not a name==version line: {line!r}"
        pins[_canon(m["name"])] = m["version"]
    return pins


def test_the_venv_holds_exactly_the_locked_versions():
    installed = {_canon(d.metadata["Name"]): d.version for d in metadata.distributions()}
    wrong = {n: (v, installed.get(n)) for n, v in _lock().items() if installed.get(n) != v}
    assert not wrong, f"locked vs installed (run `make setup`): {wrong}"


def test_the_lock_agrees_with_every_pin_in_pyproject():
    pins = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    lock = _lock()
    for pin in pins:
        name, version = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==(\S+)$", pin).groups()
        assert lock.get(_canon(name)) == version, f"{pin} vs requirements.lock: run `make lock`"
