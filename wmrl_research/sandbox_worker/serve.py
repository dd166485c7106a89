"""The worker's main loop (:func:`serve`): pre-imports the libraries, then answers one JSON request
per line on stdin with one reply per line, forking each job's supervisor ahead of its request."""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import sys
import time
import traceback

from .seccomp import join_new_session_keyring
from .supervisor import supervise

PREFORK_GRACE_S = 0.03  # a job that ends within this is answered before the next chain is forked


def _prefork(config: dict) -> tuple[int, int, int, int]:
    """Fork the next job's supervisor; returns ``(pid, pidfd, request pipe, done pipe)``."""
    req_r, req_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(req_w)
            os.close(done_r)
            supervise(
                req_r,
                done_w,
                int(config["uid"]),
                int(config["disk_mb"]),
                config.get("cgroups", []),
                config.get("job_memory"),
            )
            os._exit(0)
        except BaseException:
            traceback.print_exc()
            os._exit(70)
    os.close(req_r)
    os.close(done_w)
    return pid, os.pidfd_open(pid), req_w, done_r


def _lines(fd: int):
    """Lines from ``fd`` via ``os.read`` (no buffered-reader lock held while waiting)."""
    buf = b""
    while True:
        while b"\n" not in buf:
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        yield line


def serve(config: dict) -> None:
    reply_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints from libraries go to the log, never into the protocol

    def reply(obj: dict) -> None:
        os.write(reply_fd, (json.dumps(obj) + "\n").encode())

    join_new_session_keyring()  # before any job is forked: none inherits the host's keys
    t0 = time.monotonic()
    failed = []
    for name in config.get("preload", []):
        try:
            importlib.import_module(name)
        except Exception as e:  # a missing optional library must not stop the worker
            failed.append(f"{name}: {e}")
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        torch.set_num_threads(1)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass
    import gc

    gc.collect()
    gc.freeze()  # keep the pre-imported objects' pages shared with the forked jobs
    nxt: tuple[int, int, int, int] | None = _prefork(config)
    reply({"ready": True, "preload_s": time.monotonic() - t0, "preload_failed": failed})
    exited: list[tuple[int, int]] = []  # supervisors that reported "done" but may not be reaped yet
    for line in _lines(0):
        exited = [z for z in exited if not _reaped(*z)]
        req = json.loads(line)
        req["uid"] = config["uid"]
        chain, nxt = nxt or _prefork(config), None
        pid, pidfd, req_w, done_r = chain
        try:
            os.write(req_w, (json.dumps(req) + "\n").encode())
        except BrokenPipeError:
            pass
        os.close(req_w)
        # The supervisor reports "done" before its (slow) exit; its exit status is the backstop.
        # Forking the next chain blocks this process for tens of ms: do it while a job runs longer
        # than PREFORK_GRACE_S, else right after replying (in the host's idle time).
        budget = float(req["timeout_s"]) + 15.0
        ready, _, _ = select.select([done_r, pidfd], [], [], min(PREFORK_GRACE_S, budget))
        if not ready:
            nxt = _prefork(config)
            ready, _, _ = select.select([done_r, pidfd], [], [], budget)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        done = done_r in ready and os.read(done_r, 1) == b"d"
        os.close(done_r)
        if done:
            reply({"job": req["job"], "supervisor_exit": 0})
            exited.append((pid, pidfd))
        else:
            _, status = os.waitpid(pid, 0)
            os.close(pidfd)
            reply({"job": req["job"], "supervisor_exit": os.waitstatus_to_exitcode(status) or 70})
        if nxt is None:
            nxt = _prefork(config)
    if nxt is not None:
        os.close(nxt[2])
        exited.append((nxt[0], nxt[1]))
    for pid, _ in exited:
        os.waitpid(pid, 0)


def _reaped(pid: int, pidfd: int) -> bool:
    """Reap ``pid`` if it has exited (without blocking)."""
    if os.waitpid(pid, os.WNOHANG)[0] == 0:
        return False
    os.close(pidfd)
    return True
