import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MUJOCO_GL", "egl")

import torch  # noqa: E402

torch.set_num_threads(1)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def vla_debug(tmp_path_factory):
    """The vla-debug preset built once per session (demos, SFT, WM cached under ``root/cache``)."""
    from wmrl.config import load_config

    root = tmp_path_factory.mktemp("vla")
    cfg = load_config("vla-debug", [f"--out_dir={root / 'run'}", f"--domain.cache_dir={root / 'cache'}"])
    domain = cfg.domain.build(cfg)
    yield cfg, domain, root
    domain.close()
