"""Job functions for the executor tests: a module of their own, importable by worker processes."""

import os
import time


def square(x):
    return x * x


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
