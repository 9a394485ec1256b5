"""Processes and signals shared by the serving commands: free ports, the address a local server is reached
at, stopping on SIGINT/SIGTERM, and running a launch command (``docker run``) in the foreground."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Collection, Iterator, Sequence

from specbuild.errors import ServerError

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def free_ports(count: int, host: str = "127.0.0.1", avoid: Collection[int] = ()) -> list[int]:
    """``count`` different ports that are free right now on ``host`` (the OS picks them), none in ``avoid`` (ports
    the caller has already given out). The sockets are held until all are picked: a port released before the next
    pick may be handed out again, and a server then told to listen twice on one port (gRPC and metrics, say) fails
    to start."""
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        while len(ports) < count:
            sock = stack.enter_context(socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                                                     socket.SOCK_STREAM))
            sock.bind((host, 0))
            port = sock.getsockname()[1]
            if port not in avoid:
                ports.append(port)
        return ports


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free right now on ``host`` (the OS picks it)."""
    return free_ports(1, host)[0]


def reachable_host(host: str) -> str:
    """How this machine reaches a server bound to ``host``: loopback for every interface, IPv6 in brackets."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"[{host}]" if ":" in host else host


@contextlib.contextmanager
def stop_signals() -> Iterator[threading.Event]:
    """An event that SIGINT or SIGTERM sets while in the block (main thread only; the handlers are restored)."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def wait_until(stop: threading.Event, alive: Callable[[], bool], poll_seconds: float = 0.5) -> bool:
    """Block until ``stop`` is set (True) or ``alive()`` turns false (False)."""
    while not stop.wait(poll_seconds):
        if not alive():
            return False
    return True


def live_group_members(group: int) -> list[int]:
    """PIDs of the processes of process group ``group`` that still run (zombies excluded: they have ended and
    wait only for a parent to reap them)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # /proc/PID/stat: "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields[0] != "Z" and int(fields[2]) == group:
            members.append(int(entry.name))
    return members


def kill_group(group: int, timeout: float = 10.0) -> list[int]:
    """SIGKILL process group ``group`` and wait (up to ``timeout`` s) until none of it runs; the PIDs still
    running then (none unless the kernel is stuck). SIGKILL is delivered asynchronously: without the wait, a
    stopped server's python stubs can still be seen running right after the call."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while (left := live_group_members(group)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def run_foreground(argv: Sequence[str]) -> int:
    """Run a launch command (e.g. ``docker run ...``) in the foreground until it exits; SIGTERM and SIGINT to
    this process are passed on to it (``docker run`` passes them to the container) and waited for."""
    if shutil.which(argv[0]) is None:
        raise ServerError(f"{argv[0]} is not installed on this machine",
                          f"install {argv[0]}, or print the commands with --dry-run and run them where it is")
    process = subprocess.Popen(list(argv))
    previous = {sig: signal.signal(sig, lambda signum, _: process.send_signal(signum)) for sig in STOP_SIGNALS}
    try:
        return process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
