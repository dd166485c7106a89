"""Headless OpenGL selection for MuJoCo, done before anything imports ``mujoco``.

MuJoCo picks its GL backend from ``MUJOCO_GL`` when ``mujoco`` is first imported; on a machine without
a display the default (glfw) fails. EGL through Mesa works out of the box on our CPU machines (see
ENVIRONMENT.md), so we default to it. A user who sets ``MUJOCO_GL`` (e.g. ``osmesa``) keeps theirs.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import weakref


def select_backend() -> str | None:
    """``MUJOCO_GL=egl`` (and the matching ``PYOPENGL_PLATFORM``) where no display and no choice of the
    user's exist and ``mujoco`` is not imported yet; returns the backend in force (None: MuJoCo's own
    default). Importing this module (as ``import sims`` and so ``wmrl run`` do) calls it; an entry point
    that may import MuJoCo through another package first (lerobot's envs, MetaWorld) calls it before."""
    if "mujoco" not in sys.modules and not os.environ.get("DISPLAY"):
        os.environ.setdefault("MUJOCO_GL", "egl")
    if os.environ.get("MUJOCO_GL", "").lower() in ("egl", "osmesa"):
        os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"].lower())
    return os.environ.get("MUJOCO_GL")


select_backend()

import mujoco  # noqa: E402


def _patch_late_import() -> None:
    """If ``mujoco`` was imported before us with no backend chosen and there is no display, use EGL."""
    if os.environ.get("MUJOCO_GL") or os.environ.get("DISPLAY"):
        return
    try:
        from mujoco.egl import GLContext
        from mujoco.rendering.classic import gl_context
    except Exception:  # pragma: no cover - depends on the mujoco build
        return
    gl_context.GLContext = GLContext


_patch_late_import()


#: renderers not yet collected; an env left unclosed would otherwise free its GL context after the
#: interpreter has torn OpenGL down, printing "Exception ignored in Renderer.__del__" tracebacks
_LIVE: weakref.WeakSet[mujoco.Renderer] = weakref.WeakSet()


@functools.cache  # once per process
def _close_live_renderers_at_exit() -> None:
    atexit.register(lambda: [renderer.close() for renderer in list(_LIVE)])  # close() is idempotent


def make_renderer(model: mujoco.MjModel, height: int, width: int) -> mujoco.Renderer:
    """A ``mujoco.Renderer`` with the settings that make small offscreen renders cheap.

    Shadows, reflections and multisampling dominate the cost of a small render on llvmpipe (about 30x), and at
    64x64 they add nothing a policy could use, so they are switched off on the model.
    """
    model.light_castshadow[:] = 0
    model.vis.quality.offsamples = 0
    model.mat_reflectance[:] = 0
    model.vis.global_.offwidth = max(int(model.vis.global_.offwidth), width)
    model.vis.global_.offheight = max(int(model.vis.global_.offheight), height)
    renderer = mujoco.Renderer(model, height=height, width=width)
    _LIVE.add(renderer)
    _close_live_renderers_at_exit()  # after the first context, so atexit runs it before EGL's teardown
    return renderer
