"""Sandbox overhead per execution: warm (pre-imported, pre-forked) vs cold, vs no sandbox.

    uv run python benchmarks/sandbox_overhead.py [--n 30] [--out runs/bench/sandbox_overhead]

Writes ``sandbox_overhead.json`` and ``sandbox_overhead.png``. For each scenario it reports the
host's wall-clock per ``Sandbox.run`` call, the solution's own time as measured inside the sandbox
(``job_s``), and the overhead = wall - job_s (forking, namespaces, IO, messaging). Scenarios:

- ``noop``: a solution that only writes a tiny predictions file, run back to back (worst case for
  the warm worker: the next job's processes are forked while the previous one runs, so with no
  work to hide behind, each call pays part of a fork of the large pre-imported process);
- ``busy300ms``: a solution that computes for 0.3 s (a realistic job: the pre-fork is hidden);
- ``wine_baseline``: a real task's baseline solution (imports sklearn).

Reference points without a sandbox: ``python -c pass`` and the wine baseline as a plain subprocess.

``--side-by-side`` measures the overhead the honest way: each sandboxed job alternates with the
same job in an unsandboxed warm fork server (same pre-imports, a fork per job, no isolation),
under the same load, and reports both walls, their per-pair ratio and difference, and ``cpu_s``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from wmrl_research.sandbox import DEFAULT_PRELOAD, THREAD_ENV, Sandbox, SandboxConfig, cgroup_support
from wmrl_research.tasks import DATA_ENV, get_task

NOOP = "import numpy as np\nnp.save('predictions.npy', np.zeros(3))\n"
BUSY = (
    "import time, numpy as np\nt = time.perf_counter()\nwhile time.perf_counter() - t < 0.3:\n    pass\n"
    "np.save('predictions.npy', np.zeros(3))\n"
)


def summarise(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {
        "median": statistics.median(xs),
        "mean": statistics.fmean(xs),
        "p90": xs[min(len(xs) - 1, int(0.9 * len(xs)))],
        "min": xs[0],
        "max": xs[-1],
    }


def bench_sandbox(sb: Sandbox, source: str, data_dir: Path, n: int, pause_s: float = 0.0) -> dict:
    sb.run(source, data_dir, timeout_s=120)  # start the worker, warm caches
    walls, jobs = [], []
    for _ in range(n):
        t0 = time.monotonic()
        r = sb.run(source, data_dir, timeout_s=120)
        walls.append(time.monotonic() - t0)
        jobs.append(r.seconds)
        assert r.status == "ok", (r.status, r.message, r.stderr)
        if pause_s:
            time.sleep(pause_s)
    over = [w - j for w, j in zip(walls, jobs, strict=True)]
    return {"n": n, "wall_s": summarise(walls), "job_s": summarise(jobs), "overhead_s": summarise(over)}


def bench_plain(argv: list[str], env: dict, cwd: str, n: int) -> dict:
    walls = []
    for _ in range(n):
        t0 = time.monotonic()
        subprocess.run(argv, env=env, cwd=cwd, check=True, capture_output=True)
        walls.append(time.monotonic() - t0)
    return {"n": n, "wall_s": summarise(walls)}


FORK_SERVER = r"""
import importlib, json, os, sys, time
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except Exception:
        pass
import gc
gc.collect(); gc.freeze()


def prefork():  # like the sandbox's worker: the next job's process waits, forked ahead of time
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        cwd = os.read(r, 4096).decode()
        if not cwd:
            os._exit(0)
        os.chdir(cwd)
        code = 0
        try:
            src = open("solution.py").read()
            exec(compile(src, "solution.py", "exec"), {"__name__": "__main__"})
        except BaseException:
            code = 1
        os._exit(code)
    os.close(r)
    return pid, w


nxt = prefork()
print("ready", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    pid, w = nxt
    os.write(w, req["cwd"].encode())
    os.close(w)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), flush=True)
    nxt = prefork()
os.close(nxt[1])
os.waitpid(nxt[0], 0)
"""


class PlainForkServer:
    """The same warm design without a sandbox: one process pre-imports the sandbox's modules and
    forks the next job's process ahead of time, which runs the solution in a temporary folder (no
    namespaces, mounts, uid switch, seccomp, cgroups or limits). The baseline the sandbox's
    overhead is measured against."""

    def __init__(self, preload: tuple[str, ...], env: dict) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", FORK_SERVER, json.dumps(list(preload))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        assert self.proc.stdout.readline().strip() == "ready"

    def run(self, source: str) -> float:
        with tempfile.TemporaryDirectory() as cwd:
            (Path(cwd) / "solution.py").write_text(source)
            t0 = time.monotonic()
            self.proc.stdin.write(json.dumps({"cwd": cwd}) + "\n")
            self.proc.stdin.flush()
            reply = json.loads(self.proc.stdout.readline())
            wall = time.monotonic() - t0
            assert reply["code"] == 0 and (Path(cwd) / "predictions.npy").exists(), reply
        return wall

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def bench_side_by_side(sb: Sandbox, plain: PlainForkServer, source: str, data_dir: Path, n: int) -> dict:
    """Alternate one sandboxed and one unsandboxed execution of ``source``, ``n`` times each (same
    load for both), with a 0.2 s pause between pairs; report both walls, their per-pair ratio and
    difference (the sandbox's overhead per job), and the sandboxed jobs' ``cpu_s``."""
    sb.run(source, data_dir, timeout_s=120)
    plain.run(source)
    boxed, bare, cpu = [], [], []
    for _ in range(n):
        t0 = time.monotonic()
        r = sb.run(source, data_dir, timeout_s=120)
        boxed.append(time.monotonic() - t0)
        assert r.status == "ok", (r.status, r.message, r.stderr)
        cpu.append(r.cpu_s)
        time.sleep(0.1)
        bare.append(plain.run(source))
        time.sleep(0.1)
    return {
        "n": n,
        "sandbox_wall_s": summarise(boxed),
        "plain_fork_wall_s": summarise(bare),
        "ratio": summarise([b / p for b, p in zip(boxed, bare, strict=True)]),
        "overhead_s": summarise([b - p for b, p in zip(boxed, bare, strict=True)]),
        "sandbox_cpu_s": summarise(cpu),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--out", type=Path, default=Path("runs/bench/sandbox_overhead"))
    ap.add_argument(
        "--side-by-side",
        action="store_true",
        help="alternate each sandboxed job with the same job in an unsandboxed warm fork server",
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    task = get_task("wine_cls")
    public, _ = task.data_dirs()
    results: dict[str, dict] = {}

    t0 = time.monotonic()
    if args.side_by_side:
        env = {"PATH": "/usr/bin:/bin", DATA_ENV: str(public), **THREAD_ENV}
        plain = PlainForkServer(DEFAULT_PRELOAD, env)
        try:
            with Sandbox(SandboxConfig(warm=True)) as sb:
                for name, src in (("noop", NOOP), ("wine_baseline", task.baseline_source)):
                    results[f"side_by_side/{name}"] = bench_side_by_side(sb, plain, src, public, args.n)
        finally:
            plain.close()
        results["cgroups"] = {k: str(v) if v else None for k, v in cgroup_support().items()}
        (args.out / "sandbox_side_by_side.json").write_text(json.dumps(results, indent=2))
        for k, v in results.items():
            if "ratio" in v:
                print(
                    f"{k:28s} sandbox {1000 * v['sandbox_wall_s']['median']:7.1f} ms  plain fork "
                    f"{1000 * v['plain_fork_wall_s']['median']:7.1f} ms  ratio {v['ratio']['median']:.2f}  "
                    f"overhead {1000 * v['overhead_s']['median']:.1f} ms  cpu_s {1000 * v['sandbox_cpu_s']['median']:.1f} ms"
                )
        print(f"wrote {args.out}/sandbox_side_by_side.json")
        return
    with Sandbox(SandboxConfig(warm=True)) as sb:
        sb.run(NOOP, public, timeout_s=120)
        results["warm_worker_start_s"] = {"value": time.monotonic() - t0}
        results["warm/noop"] = bench_sandbox(sb, NOOP, public, args.n)
        results["warm/noop_spaced"] = bench_sandbox(sb, NOOP, public, args.n, pause_s=0.2)
        results["warm/busy300ms"] = bench_sandbox(sb, BUSY, public, max(5, args.n // 3))
        results["warm/wine_baseline"] = bench_sandbox(sb, task.baseline_source, public, args.n)
    with Sandbox(SandboxConfig(warm=False)) as sb:
        n_cold = max(3, args.n // 6)
        results["cold/noop"] = bench_sandbox(sb, NOOP, public, n_cold)
        results["cold/wine_baseline"] = bench_sandbox(sb, task.baseline_source, public, n_cold)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "solution.py").write_text(task.baseline_source)
        env = {"PATH": "/usr/bin:/bin", DATA_ENV: str(public), "OMP_NUM_THREADS": "1"}
        n_plain = max(3, args.n // 6)
        results["plain/python_pass"] = bench_plain([sys.executable, "-c", "pass"], env, tmp, n_plain)
        results["plain/wine_baseline"] = bench_plain([sys.executable, "solution.py"], env, tmp, n_plain)
    results["cgroups"] = {k: str(v) if v else None for k, v in cgroup_support().items()}

    (args.out / "sandbox_overhead.json").write_text(json.dumps(results, indent=2))
    plot(results, args.out / "sandbox_overhead.png")
    for k, v in results.items():
        if "wall_s" in v:
            extra = (
                f"  overhead median {1000 * v['overhead_s']['median']:.1f} ms" if "overhead_s" in v else ""
            )
            print(f"{k:24s} wall median {1000 * v['wall_s']['median']:8.1f} ms{extra}")
        else:
            print(k, v)
    print(f"wrote {args.out}/sandbox_overhead.json and .png")


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k, v in results.items() if "wall_s" in v]
    wall = [1000 * results[k]["wall_s"]["median"] for k in keys]
    sandboxed = ["job_s" in results[k] for k in keys]
    job = [1000 * results[k]["job_s"]["median"] if s else 0.0 for k, s in zip(keys, sandboxed, strict=True)]
    over = [w - j if s else 0.0 for w, j, s in zip(wall, job, sandboxed, strict=True)]
    plain = [0.0 if s else w for w, s in zip(wall, sandboxed, strict=True)]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.barh(keys, job, color="tab:green", label="solution's own time (in sandbox)")
    ax.barh(keys, over, left=job, color="tab:red", label="sandbox overhead")
    ax.barh(keys, plain, color="tab:gray", label="plain subprocess, no sandbox (total)")
    ax.set_xscale("symlog", linthresh=100)
    ax.set_xlabel("median wall-clock per execution (ms)")
    ax.axvline(50, color="k", ls=":", lw=1)
    ax.legend(loc="lower right")
    ax.set_title("Sandbox cost per execution")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
