import os

os.environ.setdefault("MUJOCO_GL", "egl")

import pytest  # noqa: E402

import sims  # noqa: E402


@pytest.fixture
def make():
    """``sims.make`` whose envs are closed at teardown, even when the test fails (no EGL noise)."""
    envs = []

    def _make(*args, **kwargs):
        env = sims.make(*args, **kwargs)
        envs.append(env)
        return env

    yield _make
    for env in envs:
        env.close()
