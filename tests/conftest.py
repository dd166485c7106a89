"""Suite-wide settings: CPU only, no hub, one torch thread per process, MuJoCo on EGL."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# Research task data of the suite: a cache of its own whose split secrets are fixed (see
# ``fixed_split_secrets``), so that no outcome depends on the secret a machine happened to draw.
# One cache per pytest-xdist worker: a test that discards a build (the redraw test) must not pull
# the data from under a test running in another worker; with fixed secrets every cache is the same.
os.environ.setdefault(
    "WMRL_RESEARCH_DATA",
    os.path.expanduser(f"~/.cache/wmrl/research-tests/{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"),
)

import torch  # noqa: E402

torch.set_num_threads(1)

import hashlib  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def fixed_split_secrets():
    """Each research task's split secret in the suite's data cache is a hash of the task's data key
    (real runs draw theirs at random, ``wmrl_research.tasks.base.build_secret``): the train/val/test
    split, and every test that trains on it, is the same on every machine. Written before any data
    is built; a test that discards a build draws a random secret for the rebuild, as real runs do."""
    from wmrl_research.tasks import list_tasks
    from wmrl_research.tasks.base import SECRET_SUFFIX, data_root

    hidden = data_root() / "hidden"
    hidden.mkdir(parents=True, exist_ok=True)
    for task in list_tasks():
        key = f"{task.id}-v{task.data_version}"
        path = hidden / f"{key}{SECRET_SUFFIX}"
        if not path.exists() and not (hidden / key).exists():
            path.write_text(hashlib.sha256(key.encode()).hexdigest()[:32])


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster (2 CPUs) for every in-process Ray test of the session: a local start
    takes 20-50 s on this machine. Started here, in the main thread, the way the trainer starts it
    (a cluster started from a thread that exits loses its GCS and raylet), and shut down at the end.
    Executors created later in the session connect to it."""
    import ray

    from wmrl.executors import RayExecutor

    RayExecutor(max_concurrent=2, timeout_s=60.0)  # ray.init, unless a cluster is already up
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def vla_debug(tmp_path_factory):
    """The vla-debug preset built once per session (demos, SFT, WM cached under ``root/cache``)."""
    from wmrl.config import load_config

    root = tmp_path_factory.mktemp("vla")
    cfg = load_config("vla-debug", [f"--out_dir={root / 'run'}", f"--domain.cache_dir={root / 'cache'}"])
    domain = cfg.domain.build(cfg)
    yield cfg, domain, root
    domain.close()
