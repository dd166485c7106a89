"""Adversarial tests of the sandbox: one per isolation property, each executed for real.

Every attack must be contained, graded as a failure (or, for a fake printed score, graded on its
real predictions only), and the next execution must still work.
"""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import wmrl_research
from wmrl_research.grading import execute_and_grade
from wmrl_research.sandbox import (
    MAX_SLOTS,
    Sandbox,
    SandboxConfig,
    SandboxError,
    cgroup_support,
    default_sandbox,
    job_uid,
)
from wmrl_research.tasks import FAILURE_SCORE, get_task

TASK = "wine_cls"
SANDBOX_UIDS = range(job_uid(0), job_uid(MAX_SLOTS - 1) + 1)  # this test process's jobs


def sandbox() -> Sandbox:
    return default_sandbox(warm=True)  # the one execute_and_grade uses


def run(source: str, timeout_s: float = 20.0):
    public, _ = get_task(TASK).data_dirs()
    return sandbox().run(source, public, timeout_s=timeout_s)


def grade(source: str, timeout_s: float = 20.0):
    return execute_and_grade(TASK, source, timeout_s=timeout_s)


def sandboxed_processes(settle_s: float = 3.0) -> list[psutil.Process]:
    """Live processes of a sandbox uid, after giving killed ones ``settle_s`` to be torn down."""
    deadline = time.monotonic() + settle_s
    while True:
        out = []
        for p in psutil.process_iter(["uids", "status"]):
            try:
                uids = p.info["uids"]
                if uids and uids.real in SANDBOX_UIDS and p.info["status"] != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                pass
        if not out or time.monotonic() > deadline:
            return out
        time.sleep(0.05)


def assert_still_works():
    """The baseline runs and scores as recorded right after an attack."""
    r = grade(get_task(TASK).baseline_source)
    assert r.status == "ok", r.message
    assert r.score == pytest.approx(0.0, abs=1e-9)
    assert not sandboxed_processes(), "a sandboxed process outlived its job"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- the plain path ----------------------------------------------------------------------------
def test_a_normal_job_sees_a_fresh_private_world():
    src = """
import os, numpy as np
print("uid", os.getuid())
print("cwd", os.getcwd(), sorted(os.listdir(".")))
print("jobs", os.listdir("/tmp/jobs"))
print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
open("scratch.txt", "w").write("x")
np.save("predictions.npy", np.zeros(3))
"""
    first = run(src)
    second = run(src)
    for r in (first, second):
        assert r.status == "ok", r.stderr
        lines = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
        assert int(lines["uid"]) in SANDBOX_UIDS
        assert lines["cwd"] == "/tmp/work ['solution.py']"  # fresh: no scratch.txt from the first job
        assert lines["jobs"] == "[]"  # no other job's folder is visible
        assert lines["pids"] == "[1]"  # only itself in its PID namespace
        assert r.predictions_path is not None and r.predictions_path.exists()


# --- adversarial: one test per property ----------------------------------------------------------
def test_cannot_read_the_hidden_test_labels():
    _, hidden = get_task(TASK).data_dirs()
    labels = hidden / "y_test.npy"
    src = f"""
import os, numpy as np
found = []
for root in ["/tmp", "/root", "/home", "/work"]:
    for dirpath, _, files in os.walk(root):
        found += [os.path.join(dirpath, f) for f in files if f.startswith("y_test")]
print("found", found)
try:
    y = np.load({str(labels)!r})
    np.save("predictions.npy", y)
    print("STOLE LABELS")
except OSError as e:
    print("blocked", type(e).__name__)
os.symlink({str(labels)!r}, "predictions.npy")  # let the grader follow a link to the labels
"""
    r = run(src)
    assert "found []" in r.stdout and "blocked FileNotFoundError" in r.stdout, r.stdout + r.stderr
    assert "STOLE" not in r.stdout
    g = grade(src)
    assert g.status == "invalid" and g.score == FAILURE_SCORE and g.raw_score is None
    assert_still_works()


def test_cannot_write_outside_its_working_folder():
    public, _ = get_task(TASK).data_dirs()
    targets = {
        "data": public / "train.npz",
        "project": Path(wmrl_research.__file__),
        "site-packages": Path(np.__file__),
    }
    before = {k: sha(p) for k, p in targets.items()}
    src = f"""
import os, sys
paths = {[str(p) for p in targets.values()]!r} + ["/tmp/data/evil", "/tmp/evil", "/etc/evil", "/tmp/jobs/evil",
         "/usr/evil", os.path.join(sys.prefix, "evil.pth")]
for p in paths:
    try:
        with open(p, "a") as f:
            f.write("# pwned\\n")
        print("WROTE", p)
    except OSError as e:
        print("blocked", p, e.errno)
big = b"x" * (1 << 20)
try:  # the working folder is a size-limited tmpfs (the disk limit)
    with open("big.bin", "wb") as f:
        for _ in range(4096):
            f.write(big)
    print("WROTE 4 GiB")
except OSError as e:
    print("disk limit", e.errno)
raise SystemExit(3)
"""
    r = run(src)
    assert "WROTE" not in r.stdout, r.stdout
    assert r.stdout.count("blocked") == 9 and "disk limit" in r.stdout, r.stdout + r.stderr
    assert r.status == "error" and r.exit_code == 3
    assert {k: sha(p) for k, p in targets.items()} == before
    assert not (Path(np.__file__).parent.parent / "evil.pth").exists()
    g = grade(src)
    assert g.status == "error" and g.score == FAILURE_SCORE
    assert_still_works()


def test_has_no_network_not_even_to_the_host():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    accepted: list[object] = []

    def accept():
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    th = threading.Thread(target=accept)
    th.start()
    src = f"""
import socket
for addr in [("127.0.0.1", {port}), ("1.1.1.1", 80), ("pypi.org", 443)]:
    try:
        socket.create_connection(addr, timeout=2).close()
        print("CONNECTED", addr)
    except OSError as e:
        print("blocked", addr, type(e).__name__)
"""
    try:
        r = run(src)
    finally:
        th.join()
        server.close()
    assert "CONNECTED" not in r.stdout and r.stdout.count("blocked") == 3, r.stdout + r.stderr
    assert not accepted
    assert r.status == "invalid"  # it exited 0 without predictions
    g = grade(src)
    assert g.status == "invalid" and g.score == FAILURE_SCORE
    assert_still_works()


def test_a_fork_bomb_is_capped_and_killed_with_its_whole_tree():
    src = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""
    t0 = time.monotonic()
    g = grade(src, timeout_s=3.0)
    assert g.status in ("timeout", "killed", "error") and g.score == FAILURE_SCORE
    assert time.monotonic() - t0 < 60
    assert not sandboxed_processes()
    assert_still_works()


def test_an_infinite_loop_times_out_on_the_wall_clock():
    g = grade("while True:\n    pass\n", timeout_s=1.5)
    assert g.status == "timeout" and g.score == FAILURE_SCORE
    assert 1.5 <= g.seconds < 15
    assert_still_works()


def test_a_sleeping_background_process_does_not_outlive_its_job():
    src = """
import os, subprocess, time, numpy as np
subprocess.Popen(["sleep", "300"], start_new_session=True)
if os.fork() == 0:
    os.setsid()
    time.sleep(300)
np.save("predictions.npy", np.zeros(3))
"""
    r = run(src)
    assert r.status == "ok", r.stderr
    assert not sandboxed_processes()
    assert_still_works()


def test_a_memory_hog_is_stopped():
    src = """
blocks = []
while True:
    blocks.append(bytearray(256 * 2**20))
"""
    g = grade(src, timeout_s=30.0)
    assert g.status in ("error", "killed") and g.score == FAILURE_SCORE
    assert "MemoryError" in g.message or g.status == "killed", g.message
    assert_still_works()


def test_a_shared_memory_hog_is_stopped_too():
    """Shared anonymous mappings escape RLIMIT_DATA; RLIMIT_AS and the memory cgroup catch them."""
    src = """
import mmap
maps = []
for i in range(64):
    m = mmap.mmap(-1, 256 * 2**20)  # MAP_SHARED | MAP_ANONYMOUS
    for _ in range(256):
        m.write(b"x" * 2**20)  # touch every page, without a large heap object
    maps.append(m)
    print("mapped", 256 * (i + 1), "MiB", flush=True)
print("ALL MAPPED")
"""
    with Sandbox(SandboxConfig(warm=True, mem_mb=256, preload=("numpy",))) as sb:
        public, _ = get_task(TASK).data_dirs()
        r = sb.run(src, public, timeout_s=60)
        assert r.status in ("error", "killed"), (r.status, r.stdout[-300:])
        assert "ALL MAPPED" not in r.stdout
        ok = sb.run("import numpy as np\nnp.save('predictions.npy', np.zeros(2))\n", public, timeout_s=20.0)
        assert ok.status == "ok"


def test_a_printed_fake_score_is_ignored():
    t = get_task(TASK)
    fake = """
import json, numpy as np
print("val_accuracy=1.0000")
print("score: 1.0  normalised: 2.0")
json.dump({"exit_code": 0, "timed_out": False, "seconds": 0.0}, open("result.json", "w"))
X = np.load(__import__("os").environ["WMRL_DATA_DIR"] + "/test.npz")["X"]
np.save("predictions.npy", np.zeros(len(X), dtype=np.int64))
"""
    g = grade(fake)
    labels = t.test_labels()
    assert g.status == "ok"
    assert g.raw_score == pytest.approx(np.mean(labels == 0))  # graded on its predictions only
    assert g.score < 0  # worse than the baseline, despite what it printed
    no_preds = grade('print("accuracy: 1.0")\nprint("score=1.0")\n')
    assert no_preds.status == "invalid" and no_preds.score == FAILURE_SCORE
    assert_still_works()


@pytest.mark.parametrize(
    "write",
    [
        "np.save('predictions.npy', np.zeros(3))",  # wrong length
        "np.save('predictions.npy', np.full(n, np.nan))",  # not finite
        "np.save('predictions.npy', np.array(['a'] * n))",  # not numeric
        "np.save('predictions.npy', np.array([{}] * n, dtype=object), allow_pickle=True)",  # a pickle
        "np.save('predictions.npy', np.full(n, 0.5))",  # class labels must be integers
        "open('predictions.npy', 'wb').write(b'not an npy file')",
        "os.mkfifo('predictions.npy')",  # would block a naive reader
        "os.mkdir('predictions.npy')",
    ],
)
def test_invalid_predictions_are_graded_as_failures(write):
    src = (
        f"import os, numpy as np\nn = len(np.load(os.environ['WMRL_DATA_DIR'] + '/test.npz')['X'])\n{write}\n"
    )
    g = grade(src)
    assert g.status == "invalid" and g.score == FAILURE_SCORE and g.raw_score is None, g


def test_cannot_kill_its_parent_the_worker_or_the_host():
    sandbox().run(
        "import numpy as np\nnp.save('predictions.npy', np.zeros(1))\n", get_task(TASK).data_dirs()[0]
    )
    workers = sandbox().worker_pids()
    assert workers
    src = """
import os, signal
print("ppid", os.getppid())
for target in [os.getppid(), -1]:
    try:
        os.kill(target, signal.SIGKILL)
    except OSError as e:
        print("blocked", target, e.errno)
for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
    if pid != os.getpid():
        try:
            os.kill(pid, signal.SIGKILL)
            print("KILLED", pid)
        except OSError:
            pass
os.kill(0, signal.SIGKILL)  # its own process group: only itself
"""
    g = grade(src)
    assert g.status in ("killed", "invalid") and g.score == FAILURE_SCORE
    assert "KILLED" not in g.message
    assert sandbox().worker_pids() == workers  # the same warm worker survived
    assert all(psutil.pid_exists(p) for p in workers)
    assert_still_works()


# --- limits, modes, errors -------------------------------------------------------------------------
def test_cpu_time_limit_kills_a_cpu_burning_job():
    cfg = SandboxConfig(warm=True, cpu_s=1, preload=("numpy",))
    with Sandbox(cfg) as sb:
        public, _ = get_task(TASK).data_dirs()
        r = sb.run("while True:\n    pass\n", public, timeout_s=20.0)
        assert r.status == "killed" and ("SIGXCPU" in r.message or "SIGKILL" in r.message), r.message
        assert r.seconds < 10
        ok = sb.run("import numpy as np\nnp.save('predictions.npy', np.zeros(2))\n", public, timeout_s=20.0)
        assert ok.status == "ok"


def test_cold_mode_runs_each_job_in_a_fresh_interpreter():
    with Sandbox(SandboxConfig(warm=False)) as sb:
        public, _ = get_task(TASK).data_dirs()
        src = "import sys\nprint('numpy' in sys.modules)\nopen('predictions.npy', 'wb').write(b'x')\n"
        r = sb.run(src, public, timeout_s=30.0)
        assert r.status == "ok" and r.stdout.strip() == "False"  # nothing pre-imported
        assert r.predictions_path is not None


def test_bad_input_fails_clearly():
    public, _ = get_task(TASK).data_dirs()
    with pytest.raises(ValueError, match="not under the sandbox's data root"):
        sandbox().run("print(1)", Path("/etc"), timeout_s=5)
    with pytest.raises(ValueError, match="timeout_s"):
        sandbox().run("print(1)", public, timeout_s=0)
    with pytest.raises(TypeError, match="str"):
        sandbox().run(b"print(1)", public)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_workers"):
        SandboxConfig(max_workers=0)
    with pytest.raises(ValueError, match="cgroups"):
        SandboxConfig(cgroups="maybe")
    assert issubclass(SandboxError, RuntimeError)


def test_cgroup_detection_reports_each_controller():
    support = cgroup_support()
    assert set(support) == {"memory", "pids"}
    for path in support.values():
        assert path is None or path.is_dir()


def test_concurrent_jobs_run_in_separate_workers():
    with Sandbox(SandboxConfig(warm=True, max_workers=2, preload=("numpy",))) as sb:
        public, _ = get_task(TASK).data_dirs()
        src = "import os, time, numpy as np\ntime.sleep(1.0)\nprint(os.getuid())\nnp.save('predictions.npy', np.zeros(1))\n"
        results: list = [None, None]

        def go(i):
            results[i] = sb.run(src, public, timeout_s=20)

        threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert all(r.status == "ok" for r in results)
        assert {r.stdout.strip() for r in results} == {str(job_uid(0)), str(job_uid(1))}  # one uid per slot
