"""The page-cache timing channel between two sandboxed jobs, measured (docs/sandbox.md states it).

    uv run python benchmarks/sandbox_pagecache_channel.py [--bits 256] [--rounds 3]

Jobs share the host's page cache of the read-only system folders. A *sender* job reads the files
that stand for 1-bits of a message (from a list both sides derive alike: files under ``/usr/share``
of 16-256 KiB, sorted, a different slice each round); a later *receiver* job, on the same warm
worker, times the first 4 KiB read of every file of the slice: a cached file reads in microseconds,
an uncached one pays a disk read. Each file carries one bit once (the receiver's read caches it),
so the channel's capacity is the number of files the host has not cached, and its rate is bits per
second of the two jobs' time. Prints one JSON line per round and a summary: bits sent, bit errors,
the receiver's and sender's seconds, and bits per second (correct bits / both jobs' seconds).
Files some other process read in between (or never evicted) read as 1s: errors, counted.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics

from wmrl_research.sandbox import Sandbox, SandboxConfig
from wmrl_research.tasks import get_task

LIST = """
import os
files = []
for root, dirs, names in os.walk("/usr/share"):
    dirs.sort()
    for n in sorted(names):
        p = os.path.join(root, n)
        try:
            if os.path.isfile(p) and not os.path.islink(p) and 16384 <= os.path.getsize(p) <= 262144:
                files.append(p)
        except OSError:
            pass
files = files[{start}:{start} + {n}]
"""
SEND = (
    LIST
    + """
import time
t = time.perf_counter()
for p, bit in zip(files, {bits!r}):
    if bit:
        with open(p, "rb") as f:
            f.read(4096)
print("sent", len(files), time.perf_counter() - t)
"""
)
RECEIVE = (
    LIST
    + """
import time
times = []
t0 = time.perf_counter()
for p in files:
    t = time.perf_counter_ns()
    with open(p, "rb") as f:
        f.read(4096)
    times.append(time.perf_counter_ns() - t)
print("times", times, time.perf_counter() - t0)
"""
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bits", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--start", type=int, default=1000, help="first file of the list to use")
    args = ap.parse_args()
    public, _ = get_task("wine_cls").data_dirs()
    total_ok = total_bits = 0
    total_s = 0.0
    with Sandbox(SandboxConfig(warm=True, preload=("numpy",))) as sb:
        for k in range(args.rounds):
            start = args.start + k * args.bits
            bits = [secrets.randbits(1) for _ in range(args.bits)]
            s = sb.run(SEND.format(start=start, n=args.bits, bits=bits), public, timeout_s=120)
            r = sb.run(RECEIVE.format(start=start, n=args.bits), public, timeout_s=120)
            line = r.stdout.strip().splitlines()[-1].split(" ", 1)[1]
            times = json.loads(line.rsplit(" ", 1)[0])
            threshold = 20_000  # ns: a cached 4 KiB read takes a few microseconds
            got = [int(t < threshold) for t in times]
            ok = sum(a == b for a, b in zip(got, bits, strict=True))
            secs = s.seconds + r.seconds
            total_ok, total_bits, total_s = total_ok + ok, total_bits + len(bits), total_s + secs
            print(
                json.dumps(
                    {
                        "round": k,
                        "bits": len(bits),
                        "errors": len(bits) - ok,
                        "send_s": round(s.seconds, 4),
                        "receive_s": round(r.seconds, 4),
                        "median_ns_sent_1": statistics.median(
                            t for t, b in zip(times, bits, strict=True) if b
                        ),
                        "median_ns_sent_0": statistics.median(
                            t for t, b in zip(times, bits, strict=True) if not b
                        ),
                    }
                )
            )
    print(
        json.dumps(
            {
                "bits": total_bits,
                "error_rate": round(1 - total_ok / total_bits, 4),
                "jobs_s": round(total_s, 3),
                "bits_per_s": round(total_ok / total_s, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
