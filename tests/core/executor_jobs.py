"""Job functions for the executor tests: a module of their own, importable by worker processes."""

import os
import time


def square(x):
    return x * x


def graded(x):
    """A reward with the domain's word for how its execution ended."""
    from wmrl.domain import Graded

    return Graded(x * x, f"outcome {x}")


def boom(x):
    raise ValueError(f"bad input {x}")


def sleepy(s):
    time.sleep(s)
    return s


def span(s):
    t0 = time.time()
    time.sleep(s)
    return t0 * 1000 + 0.0  # start time in ms; end = start + s


def pid_job(_):
    return float(os.getpid())


_WORKER = {"initialized_by": 0.0}


def slow_initializer():
    """Stands in for a sandbox's start: longer than the tests' job timeout."""
    time.sleep(1.5)
    _WORKER["initialized_by"] = float(os.getpid())


def initialized_by(_):
    return _WORKER["initialized_by"]


def broken_initializer():
    raise RuntimeError("no sandbox on this worker")
