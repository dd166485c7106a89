"""The configuration's words for the command line: field listings, the closest-name hints of an
unknown field, malformed YAML in one line, and a config printed as a commented preset.

Pure functions of a config class or instance (``wmrl.config`` holds the types and calls these); this
module imports nothing of wmrl.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import textwrap
import typing
from pathlib import Path
from typing import Any

import draccus
from draccus.wrappers.docstring import HelpOrder, get_attribute_docstring, get_preferred_help_text


def did_you_mean(name: str, choices, cutoff: float = 0.6) -> str:
    """``"; did you mean 'x'?"`` for the valid name closest to ``name`` (difflib), or ``""``."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=cutoff)
    return f"; did you mean {close[0]!r}?" if close else ""


def malformed_yaml(path: Path, e: Exception) -> str:
    """PyYAML's several-line report as one line: where, what, and the construct it was in. A line
    holding ``=[`` (a list-valued override inside a YAML list) gets the fix: quote it."""
    mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
    if mark is None or problem is None:
        return f"malformed YAML in {path}: {' '.join(str(e).split())}"
    where = f"malformed YAML in {path}, line {mark.line + 1}, column {mark.column + 1}: {problem}"
    context, start = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and start is not None:
        where += f" ({context} at line {start.line + 1})"
    lines = path.read_text().splitlines() if path.is_file() else []
    if mark.line < len(lines) and "=[" in lines[mark.line]:
        where += '; quote an override whose value is a list: "--domain.tasks=[a,b]"'
    return where


def field_names(cls: type, prefix: str = "") -> list[str]:
    """Every dotted field name of a config dataclass (``grpo.group_size``); a section that is a
    registry of choices (``RunConfig.domain``) lists ``domain.type`` and the fields of every
    registered choice (every domain loaded so far: ``wmrl.config.load_domains``), unless the registry
    says its fields are not listed (``FIELDS_LISTED = False``: ``method_config``, one name)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        name, sub = prefix + f.name, hints.get(f.name)
        if sub is not None and _is_registry(sub) and not getattr(sub, "FIELDS_LISTED", True):
            out.append(name)
        elif sub is not None and _is_registry(sub):
            out.append(f"{name}.type")
            for choice in sub.get_known_choices().values():
                out += field_names(choice, f"{name}.")
        elif isinstance(sub, type) and dataclasses.is_dataclass(sub):
            out += field_names(sub, f"{name}.")
        else:
            out.append(name)
    return sorted(set(out))


def selected_domain(overrides: list[str], content: dict | None) -> str | None:
    for arg in overrides:
        m = re.fullmatch(r"--domain\.type=(\w+)", arg)
        if m:
            return m.group(1)
    dom = (content or {}).get("domain")
    return dom.get("type") if isinstance(dom, dict) else None


def _is_registry(cls) -> bool:
    return isinstance(cls, type) and issubclass(cls, draccus.ChoiceRegistry)


def _known_names(run_cls: type, domain: str | None) -> list[str]:
    """The field names of ``run_cls``; of its ``domain`` section, only those of ``domain`` when it
    is a registered domain."""
    names = [n for n in field_names(run_cls) if not n.startswith("domain.")]
    registry = typing.get_type_hints(run_cls)["domain"]
    dom_cls = registry.get_known_choices().get(domain)
    if dom_cls is None:
        return names + [n for n in field_names(run_cls) if n.startswith("domain.")]
    return names + ["domain.type"] + field_names(dom_cls, "domain.")


def unknown_flags_message(run_cls: type, overrides: list[str], content: dict | None, fallback: str) -> str:
    """One line naming every override that is no field of ``run_cls``, each with the closest field
    name (``content``: the preset's YAML, for the domain it selects)."""
    domain = selected_domain(overrides, content)
    known = _known_names(run_cls, domain)
    bad = []
    for arg in overrides:
        if not arg.startswith("--"):
            continue
        key = arg[2:].split("=", 1)[0]
        if key in known or key == "config_path" or key in {n.split(".")[0] for n in known}:
            continue
        # A known section: suggest one of its fields (grpo.group_sise -> grpo.group_size).
        section, _, leaf = key.rpartition(".")
        same = [n.rpartition(".")[2] for n in known if n.rpartition(".")[0] == section]
        close = difflib.get_close_matches(leaf, same, n=1) if same else []
        if not same:
            close = [c[2:] for c in difflib.get_close_matches(f"--{key}", [f"--{n}" for n in known], n=1)]
            leaf, section = (close[0], "") if close else (leaf, section)
        hint = f"; did you mean --{section + '.' if section else ''}{close[0]}?" if close else ""
        if not hint and 0 < len(same) <= 16:
            hint = f"; {section}'s fields: {', '.join(same)}"
        where = f" for domain.type={domain}" if domain and key.startswith("domain.") else ""
        bad.append(f"unknown config field --{key}{where}{hint}")
    if not bad:
        return f"invalid command-line overrides {overrides}: {fallback}"
    return "; ".join(bad) + " (`wmrl config PRESET` lists every field)"


def with_suggestion(run_cls: type, message: str, content: dict | None) -> str:
    """Add the closest valid name to draccus's message about unknown fields of a YAML file."""
    m = re.search(r"`([\w.]+)`: The fields `([^`]*)` are not valid for (\w+)", message)
    if not m:
        return message
    section, fields, _ = m.groups()
    known = [
        n.rpartition(".")[2]
        for n in _known_names(run_cls, selected_domain([], content))
        if n.rpartition(".")[0] == section
    ]
    hints = [did_you_mean(f.strip(), known) for f in fields.split(",")]
    return message + "".join(h for h in hints if h)


def describe_config(cfg: Any) -> str:
    """``cfg`` as commented YAML: every field with its value, the comment above its declaration
    (read by draccus, the same text as ``--help``) and its default where the value differs. The
    output is itself a valid preset."""
    return "\n".join(_describe(cfg, 0)) + "\n"


def _describe(obj: Any, depth: int) -> list[str]:
    pad = "  " * depth
    lines: list[str] = []
    if isinstance(obj, draccus.ChoiceRegistry):  # a registered choice, e.g. the domain
        lines.append(f"{pad}type: {type(obj).get_choice_name(type(obj))}")
    for f in dataclasses.fields(obj):
        doc = get_preferred_help_text(get_attribute_docstring(type(obj), f.name), HelpOrder.above)
        if doc:
            text = " ".join(doc.split())
            lines += [f"{pad}# {line}" for line in textwrap.wrap(text, max(40, 100 - len(pad)))]
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            lines.append(f"{pad}{f.name}:")
            lines += _describe(value, depth + 1)
            continue
        encoded = draccus.encode(value)
        line = f"{f.name}: {_yaml_value(encoded)}"
        default = _default_of(f)
        if default is not dataclasses.MISSING and draccus.encode(default) != encoded:
            line += f"  # default: {_yaml_value(draccus.encode(default))}"
        lines.append(pad + line)
    return lines


def _yaml_value(value: Any) -> str:
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text.removesuffix("...").strip()


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING
