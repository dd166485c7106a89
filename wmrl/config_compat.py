"""Settings written where they no longer live: shared component sections and older runs' files.

A run keeps its method's settings in ``method_config`` (wmrl/method_config.py). Presets, grid specs'
shared overrides and every run saved before methods owned their settings name them by component
instead, at the top level: ``debias:`` or ``--debias.warmup_pairs=16``, ``denoise``, ``ppi`` (any
component section of a registered method's config). One such *shared* section serves every method
that keeps the component: ``vla-rl.yaml`` sets ppi's λ tuner for ``--method=ppi`` though its own
method is ``real``, and a grid spec's ``--ppi.prior_from_log=true`` reaches each cell whose method
is ppi. :func:`route_settings` moves each into ``method_config`` where the run's method keeps the
component (``--ppi.lam=0`` is ``--method_config.ppi.lam=0`` under ``method=ppi``); a method that keeps
none takes nothing of it, as before, but its values are still checked (:func:`check_unused`). A
``method_config`` setting that the run's method does not have is refused in one line.

:func:`upgrade_saved` brings a saved config, a checkpoint's fingerprint and today's config to one
form to compare them in: fields removed since dropped, fields added since filled with the value
that reproduces how such runs trained, each kept component under its own name.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import typing
from pathlib import Path
from typing import Any

from draccus.cfgparsing import parse_string

from wmrl.config_checks import ConfigError
from wmrl.config_messages import did_you_mean
from wmrl.method_config import DEFAULT_METHOD, RunView, load_methods, registered_method

SECTION = "method_config"  # the run config's section of its method's settings

# A run folder or checkpoint saved before a field existed holds no value for it: the value that
# reproduces how such runs trained (a field added since whose default changes training, such as
# ppi's lambda shrinkage, is then named in the resume's mismatch message, not switched on silently).
FIELDS_ADDED: dict[str, Any] = {"wm_placebo": False, "ppi.shrink_confidence": None}
# Fields that no longer exist, dropped from an older run's files: domain.progress is now
# tracking.progress, the one switch for every progress bar; compare (the methods and seeds `wmrl run`
# swept) is a grid spec's now (`wmrl compare SPEC`); executor.ray_num_cpus is executor.num_cpus.
FIELDS_REMOVED = ("domain.progress", "compare", "executor.ray_num_cpus")


def shared_sections(run_fields: set[str]) -> dict[str, type]:
    """The component sections of every registered method's config by name (``debias``,
    ``denoise``, ``ppi``) and their config classes: those a preset or flag may set at the top level
    (none that is a field of the run config itself, ``run_fields``)."""
    sections: dict[str, type] = {}
    for method in load_methods().values():
        hints = typing.get_type_hints(method.config)
        for f in dataclasses.fields(method.config):
            kind = hints[f.name]
            if f.name not in run_fields and isinstance(kind, type) and dataclasses.is_dataclass(kind):
                sections.setdefault(f.name, kind)
    return sections


def chosen_method(content: dict, overrides: list[str]) -> str:
    """The run's method: the last ``--method=`` override, else the file's ``method``, else the default."""
    name = content.get("method", DEFAULT_METHOD)
    for arg in overrides:
        key, _, value = arg.partition("=")
        if key == "--method":
            name = value
    if not isinstance(name, str):
        raise ConfigError(f"method={name!r} must be a registered method's name (`wmrl --help` lists them)")
    return name


def route_settings(
    content: dict | None, overrides: list[str], run_fields: set[str]
) -> tuple[dict, list[str], dict[str, dict]]:
    """A preset's ``content`` and ``--a.b=v`` ``overrides`` with every method setting where it lives
    now, in the run's ``method_config``; and the shared sections that the run's method keeps no
    component of, as ``{section: values}``, for :func:`check_unused`.

    The overrides come back with ``--method_config.type=<method>`` first (draccus builds that
    method's config) and each shared ``--<component>.<field>=v`` the method keeps as
    ``--method_config.<component>.<field>=v``, in place, so that a later flag still wins. In the file,
    its own ``method_config`` wins over its shared sections; where ``--method`` chooses another
    method than the file's, the file's ``method_config`` is read as shared sections too."""
    content, overrides = copy.deepcopy(content or {}), _joined(overrides)
    method = chosen_method(content, overrides)
    config_cls = registered_method(method).config
    keeps = {f.name for f in dataclasses.fields(config_cls)}
    sections = shared_sections(run_fields)

    written_for = content.get("method", DEFAULT_METHOD)
    own = content.pop(SECTION, None) or {}
    if not isinstance(own, dict):
        raise ConfigError(f"{SECTION} must hold a mapping of {written_for}'s settings, got {own!r}")
    if own.pop("type", written_for) != written_for:
        raise ConfigError(f"{SECTION}.type differs from method={written_for!r}: set the method with `method`")
    shared = {name: content.pop(name) or {} for name in list(content) if name in sections}
    if written_for != method:  # the file's method settings were another method's: shared ones here
        shared, own = _merged(shared, {k: v for k, v in own.items() if k in sections}), {}
    _check_keys(config_cls, own, SECTION, method)
    unused: dict[str, dict] = {}
    for name, values in shared.items():
        if not isinstance(values, dict):
            raise ConfigError(f"{name} must hold a mapping of {name}'s settings, got {values!r}")
        _check_keys(sections[name], values, name)
        if name in keeps:
            own[name] = _merged(values, own.get(name) or {})
        else:
            unused[name] = values
    if own:
        content[SECTION] = own

    routed = [f"--{SECTION}.type={method}"]
    for arg in overrides:
        key, eq, value = arg.partition("=")
        head, _, rest = key.removeprefix("--").partition(".")
        if not (key.startswith("--") and eq and rest and (head in sections or head == SECTION)):
            routed.append(arg)
        elif head == SECTION:
            if rest == "type":
                raise ConfigError(f"{key}: the run's method is --method={method}, not a field of {SECTION}")
            _check_path(config_cls, rest.split("."), SECTION, method)
            routed.append(arg)
        else:
            _check_path(sections[head], rest.split("."), head)
            if head in keeps:
                routed.append(f"--{SECTION}.{head}.{rest}={value}")
            else:
                unused[head] = _merged(unused.get(head) or {}, _nested(rest.split("."), parse_string(value)))
    return content, routed, unused


def check_unused(unused: dict[str, dict], run: RunView) -> None:
    """Check the shared sections that ``run``'s method keeps no component of as before methods owned
    their settings: each builds its component's config (its ``__post_init__``) and passes the
    component's ``check(run)``, so a bad value fails whatever method reads it."""
    import draccus

    sections = shared_sections({f.name for f in dataclasses.fields(run)})
    for name, values in unused.items():
        component = draccus.decode(sections[name], values)
        component_check = getattr(component, "check", None)
        if component_check is not None:
            component_check(run)


def upgrade_saved(d: dict, fill_added: bool = True) -> dict:
    """A copy of a saved config, a checkpoint's fingerprint or today's config as plain data, in the
    one form they are compared in: ``FIELDS_REMOVED`` dropped, with ``fill_added`` the
    ``FIELDS_ADDED`` filled where absent, and each component the method keeps at the top level under
    its name (as presets, older runs and every checkpoint's fingerprint write them, and as a
    mismatch is named: ``ppi.shrink_confidence``), those it does not keep dropped; ``method_config``
    keeps the method's other settings. Without ``fill_added`` (a preset, which :func:`route_settings`
    routes), only cleaned: a field it leaves out takes its default."""
    d = copy.deepcopy(d)
    for name in FIELDS_REMOVED:
        section, _, leaf = name.rpartition(".")
        parent = d.get(section) if section else d
        if isinstance(parent, dict):
            parent.pop(leaf, None)
    if not fill_added:
        return d
    for name, value in FIELDS_ADDED.items():
        section, _, leaf = name.rpartition(".")
        parent = d.get(section) if section else d
        if isinstance(parent, dict):
            parent.setdefault(leaf, value)
    keeps = {f.name for f in dataclasses.fields(registered_method(d.get("method", DEFAULT_METHOD)).config)}
    sections = shared_sections(set())
    for name in [n for n in d if n in sections and n not in keeps]:
        del d[name]
    own = d.pop(SECTION, None) or {}
    own.pop("type", None)
    for name in [n for n in own if n in sections]:
        d[name] = _merged(d.get(name) or {}, own.pop(name))
    d[SECTION] = own
    return d


@contextlib.contextmanager
def written_as(path: Path | None, original: dict | None, content: dict | None):
    """``path``, or where ``content`` differs from the file's ``original`` content, a temporary copy of
    ``content`` (with the same file name), so that draccus reads the routed, cleaned settings."""
    if content == original or (path is None and not content):  # nothing moved
        yield path
        return
    import tempfile

    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        copy_path = Path(tmp) / (path.name if path is not None else "overrides.yaml")
        copy_path.write_text(yaml.safe_dump(content, sort_keys=False))
        yield copy_path


def _joined(overrides: list[str]) -> list[str]:
    """``--a.b v`` pairs written ``--a.b=v`` (argparse takes both)."""
    out, i = [], 0
    while i < len(overrides):
        arg = overrides[i]
        if (
            arg.startswith("--")
            and "=" not in arg
            and i + 1 < len(overrides)
            and not overrides[i + 1].startswith("--")
        ):
            out.append(f"{arg}={overrides[i + 1]}")
            i += 2
        else:
            out.append(arg)
            i += 1
    return out


def _merged(base: dict, top: dict) -> dict:
    """``base`` with ``top``'s values over it, nested mappings merged key by key."""
    out = dict(base)
    for key, value in top.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merged(out[key], value) if both else value
    return out


def _nested(path: list[str], value: Any) -> dict:
    return {path[0]: _nested(path[1:], value) if len(path) > 1 else value}


def _check_keys(cls: type, values: Any, where: str, method: str | None = None) -> None:
    """Refuse a key of the mapping ``values`` (a section ``where`` of class ``cls``) that is no field."""
    if isinstance(values, dict):
        for key, sub in values.items():
            _check_path(cls, [str(key)], where, method)
            kind = typing.get_type_hints(cls).get(str(key))
            if isinstance(kind, type) and dataclasses.is_dataclass(kind):
                _check_keys(kind, sub, f"{where}.{key}", method)


def _check_path(cls: type, path: list[str], where: str, method: str | None = None) -> None:
    """Refuse the dotted ``path`` below section ``where`` (of class ``cls``) unless it names a
    setting: one line saying whose settings these are, which there are, and the closest name."""
    for i, key in enumerate(path):
        names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
        if key not in names:
            owner = f"method {method!r}" if method else where
            here = ".".join([where, *path[:i]])
            raise ConfigError(
                f"{where}.{'.'.join(path)}: {owner} has no setting {'.'.join(path[: i + 1])!r} "
                f"({here}'s settings: {', '.join(names) or 'none'}){did_you_mean(key, names)}"
            )
        cls = typing.get_type_hints(cls)[key]
