"""Ties a local server's life to the process that started it (the demo's or the tests' broker, a local cluster).

The servers run in sessions of their own (so that a terminal's Ctrl-C reaches the program, which then stops them
in order), which also means that nothing stops them when the program dies without its clean-up: SIGTERM,
SIGKILL, a crashed test run. :func:`guard` starts a small watchdog process that polls its parent and, once the
parent is gone, stops the server's process group (SIGTERM, then SIGKILL after a grace period). The watchdog
ends by itself when the server ends first.

Run as ``python -m phases._internal.runtime.watchdog <server pgid> <grace s>`` by :func:`guard` only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.5


def guard(server_pgid: int, grace_s: float = 30.0) -> subprocess.Popen:
    """Starts the watchdog of the process group ``server_pgid`` for the calling process."""
    return subprocess.Popen(
        [sys.executable, "-m", "phases._internal.runtime.watchdog", str(server_pgid), str(grace_s)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C meant for the program must not stop the watchdog before it acts
        cwd=str(Path(__file__).resolve().parents[3]),  # the project root
    )


def stop(process: subprocess.Popen | None, guard_process: subprocess.Popen | None, timeout: float = 30.0) -> None:
    """Stops a local server started in a session of its own (SIGTERM to its group, SIGKILL after ``timeout``), then
    waits for its watchdog to end; nothing when it has ended already."""
    if process is not None and process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
    if guard_process is not None:
        guard_process.wait(10)  # it ends once the server has


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _watch(pgid: int, grace_s: float) -> None:
    parent = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while _alive(pgid):
        if os.getppid() != parent:  # the parent is gone: this process was handed to init (or a subreaper)
            os.killpg(pgid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while _alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if _alive(pgid):
                os.killpg(pgid, signal.SIGKILL)
            return
        time.sleep(POLL_S)


if __name__ == "__main__":
    _watch(int(sys.argv[1]), float(sys.argv[2]))
