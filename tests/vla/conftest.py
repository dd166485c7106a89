import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MUJOCO_GL", "egl")

import torch  # noqa: E402

torch.set_num_threads(1)

# vla_debug, the vla-debug preset built once per session: tests/conftest.py (the domain contract's test uses it too)
