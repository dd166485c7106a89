"""Suite-wide settings: CPU only, no hub, one torch thread per process, MuJoCo on EGL."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch  # noqa: E402

torch.set_num_threads(1)

import pytest  # noqa: E402


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
