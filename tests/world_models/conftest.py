import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MUJOCO_GL", "egl")

import torch  # noqa: E402

torch.set_num_threads(1)
