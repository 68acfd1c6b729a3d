"""Frozen config dataclasses as command-line flags and config files, written once.

A command whose settings are a tree of frozen dataclasses (``podium train``: ``TrainConfig``
with its ``ppo``, ``env`` and ``network`` sections) gets from :func:`settings_of` one
:class:`Setting` per leaf field, and from it:

* a flag per setting (:func:`add_flags`): ``--<field>`` for the root's own fields,
  ``--<section>-<field>`` inside a section (underscores become dashes: ``--ppo-clip-coef``),
  typed by the annotation, its help the field's docstring, its default the one in force;
* a config file read as the same tree (:func:`load_file`, YAML or TOML: top-level keys are the
  root's fields, a section is a mapping under its name); an unknown key is a
  :class:`~podium.errors.ConfigError` naming it and the nearest valid names;
* the resolved tree back as plain values (:func:`plain`), so a file written from a run's
  config, read again, gives that config.

Values from flags (strings) and files (YAML/TOML scalars and lists) go through the one
:func:`coerce`, so both accept and refuse the same things; text is read by
:func:`podium.config.convert`, as environment variables are. Fields the caller computes itself
(``derived``: e.g. the environment's slot count, set from the task suites) are neither flags
nor file keys: a file that sets one is refused with the reason.

Why not a third-party package: the settings must stay the dataclasses the code already uses
(frozen, with a docstring per field), and the flag names of ``podium train`` predate this.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import re
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from podium.config import convert, field_docs
from podium.errors import ConfigError

_NONE_WORDS = ("none", "null")
"""What a flag or file value spells for None, for an optional setting."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One leaf field of a config tree."""

    path: tuple[str, ...]
    """Field names from the root: ``("seed",)``, ``("ppo", "clip_coef")``."""
    annotation: Any
    """The field's resolved type (``int``, ``Path | None``, ``tuple[int, int]``, a ``Literal``)."""
    default: Any
    """Its value in the base config (the default in force, shown in the help)."""
    doc: str
    """The field's docstring (empty when it has none)."""

    @property
    def key(self) -> str:
        """Dotted name, as errors and written files name it: ``ppo.clip_coef``."""
        return ".".join(self.path)

    @property
    def flag(self) -> str:
        """The generated flag: ``--seed``, ``--ppo-clip-coef``."""
        return "--" + "-".join(self.path).replace("_", "-")

    @property
    def dest(self) -> str:
        """The argparse destination (unique: the dotted key with ``.`` as ``__``)."""
        return "__".join(self.path)


def settings_of(
    config: Any, *, derived: Mapping[str, str] | None = None, _prefix: tuple[str, ...] = ()
) -> list[Setting]:
    """Every leaf setting of the dataclass instance ``config``, depth first, a field whose
    value is a dataclass being a section; ``derived`` (dotted key → why) names the fields
    left out (the caller sets them). The defaults are ``config``'s values."""
    derived = derived or {}
    hints = typing.get_type_hints(type(config))
    docs = field_docs(type(config))
    out: list[Setting] = []
    for f in dataclasses.fields(config):
        path = (*_prefix, f.name)
        value = getattr(config, f.name)
        if ".".join(path) in derived:
            continue
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out += settings_of(value, derived=derived, _prefix=path)
        else:
            out.append(Setting(path, hints[f.name], value, docs.get(f.name, "")))
    return out


# -- values -------------------------------------------------------------------------------------


def _optional_inner(tp: Any) -> Any | None:
    """``X`` for ``X | None`` (or ``Optional[X]``), else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0]
    return None


def type_name(tp: Any) -> str:
    """How help and errors spell a setting's type."""
    inner = _optional_inner(tp)
    if inner is not None:
        return f"{type_name(inner)} or none"
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"list of {type_name(args[0])}"
        return f"{len(args)} × {type_name(args[0])}"
    return {Path: "path", bool: "boolean", int: "integer", float: "number", str: "string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return bool(convert(value, bool))
    raise ValueError


def _int(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        return int(convert(value, int))
    raise ValueError


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError
    out = float(convert(value, float)) if isinstance(value, str) else float(value)
    if not math.isfinite(out):
        raise ValueError
    return out


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError
    return value


def _path(value: Any) -> Path:
    if not isinstance(value, str | Path) or not str(value).strip():
        raise ValueError
    return Path(value)


_SCALARS: dict[Any, Any] = {bool: _bool, int: _int, float: _float, str: _str, Path: _path}
"""The scalar types a setting may have, each with its parser of native values and text."""


def _scalar(value: Any, tp: Any) -> Any:
    """``value`` (a native value or a string) as scalar type ``tp``; ValueError if it is not
    (TypeError for a type no setting may have)."""
    parse = _SCALARS.get(tp)
    if parse is None:
        raise TypeError(f"settings of type {tp!r} are not supported")
    return parse(value)


def coerce(value: Any, tp: Any, key: str) -> Any:
    """``value`` (from a flag: a string; from a file: a scalar or a list) as type ``tp``;
    a :class:`ConfigError` naming ``key``, the type and the value otherwise."""
    inner = _optional_inner(tp)
    if inner is not None:
        if value is None or (isinstance(value, str) and value.strip().lower() in _NONE_WORDS):
            return None
        return coerce(value, inner, key)
    origin = typing.get_origin(tp)
    try:
        if origin is typing.Literal:
            choices = typing.get_args(tp)
            if value in choices:
                return value
            raise ValueError
        if origin is tuple:
            return _tuple(value, typing.get_args(tp), key)
        return _scalar(value, tp)
    except (ValueError, TypeError):
        raise ConfigError(f"{key}: expected {type_name(tp)}, got {value!r}") from None


def _tuple(value: Any, args: tuple[Any, ...], key: str) -> tuple[Any, ...]:
    """A tuple setting from a list (files, repeated flag values) or a comma-separated string."""
    items = [v for v in value.split(",") if v.strip()] if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise ValueError
    variadic = len(args) == 2 and args[1] is Ellipsis
    if not variadic and len(items) != len(args):
        raise ConfigError(f"{key}: expected {len(args)} values, got {len(items)} ({value!r})")
    if variadic and not items:
        raise ConfigError(f"{key}: expected at least one value")
    types_ = [args[0]] * len(items) if variadic else list(args)
    return tuple(coerce(v, t, key) for v, t in zip(items, types_, strict=True))


def plain(value: Any) -> Any:
    """A setting's value as YAML/TOML writes it (paths as strings, tuples as lists)."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    return value


# -- flags --------------------------------------------------------------------------------------


def _help(setting: Setting) -> str:
    """The help line: the docstring with its markup eased, the type, the default."""
    doc = re.sub(r":\w+:`~?([^`]+)`", r"\1", setting.doc)
    doc = " ".join(doc.replace("``", "").split()).replace("%", "%%")
    shown = plain(setting.default)
    if isinstance(shown, list):
        shown = " ".join(str(v) for v in shown)
    default = "none" if shown is None else str(shown).replace("%", "%%")
    return f"{doc} [{type_name(setting.annotation)}; default: {default}]"


def add_flags(
    parser: argparse.ArgumentParser | Any,
    settings: Sequence[Setting],
    *,
    aliases: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """One flag per setting (plus ``aliases``: dotted key → older flag names kept working).

    A flag not given leaves nothing in the namespace (``argparse.SUPPRESS``), so
    :func:`flag_values` sees exactly what the command line set: flags override a config
    file, which overrides the defaults. Booleans get ``--x`` / ``--no-x``; tuples take their
    values space-separated (``--sizes 5 60``); optional settings take ``none``.
    """
    aliases = aliases or {}
    for s in settings:
        names = [s.flag, *aliases.get(s.key, ())]
        common: dict[str, Any] = {"dest": s.dest, "default": argparse.SUPPRESS, "help": _help(s)}
        tp = _optional_inner(s.annotation) or s.annotation
        if s.annotation is bool:
            parser.add_argument(*names, action=argparse.BooleanOptionalAction, **common)
        elif typing.get_origin(tp) is tuple:
            args = typing.get_args(tp)
            nargs: int | str = "+" if len(args) == 2 and args[1] is Ellipsis else len(args)
            parser.add_argument(
                *names, nargs=nargs, metavar=_METAVARS.get(args[0], "VALUE"), **common
            )
        else:
            parser.add_argument(*names, type=_flag_type(s), metavar=_metavar(s), **common)


_METAVARS: dict[Any, str] = {int: "N", float: "X", Path: "PATH"}


def _metavar(s: Setting) -> str:
    tp = _optional_inner(s.annotation) or s.annotation
    if typing.get_origin(tp) is typing.Literal:
        return "{" + ",".join(str(a) for a in typing.get_args(tp)) + "}"
    return _METAVARS.get(tp, "VALUE")


def _flag_type(s: Setting) -> Any:
    """argparse ``type=``: the one :func:`coerce`, its error shown as argparse's own."""

    def parse(text: str) -> Any:
        try:
            return coerce(text, s.annotation, s.flag)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{s.flag}: ")) from None

    parse.__name__ = type_name(s.annotation)
    return parse


def flag_values(args: argparse.Namespace, settings: Sequence[Setting]) -> dict[str, Any]:
    """The settings the command line gave, dotted key → typed value."""
    out: dict[str, Any] = {}
    for s in settings:
        if hasattr(args, s.dest):
            out[s.key] = coerce(getattr(args, s.dest), s.annotation, s.flag)
    return out


def given_flag(args: argparse.Namespace, setting: Setting) -> bool:
    """Whether the command line gave ``setting``."""
    return hasattr(args, setting.dest)


# -- files --------------------------------------------------------------------------------------


def read_tree(path: Path) -> dict[str, Any]:
    """A YAML (``.yaml``/``.yml``) or TOML (``.toml``) file as a mapping; ConfigError naming
    the file when it is missing, unreadable, malformed or not a mapping."""
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".toml"):
        raise ConfigError(f"{path}: a config file is .yaml, .yml or .toml")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(text) if suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not valid {suffix[1:].upper()}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    return data


def file_values(
    tree: Mapping[str, Any],
    settings: Sequence[Setting],
    *,
    derived: Mapping[str, str] | None = None,
    source: str = "config",
) -> dict[str, Any]:
    """A config tree's settings, dotted key → typed value; ConfigError naming the first key
    that is unknown (with the nearest valid names), derived (with the reason), misplaced
    (a section given a scalar, a setting given a mapping) or of the wrong type."""
    by_key = {s.key: s for s in settings}
    sections = {".".join(s.path[:i]) for s in settings for i in range(1, len(s.path))}
    derived = derived or {}
    out: dict[str, Any] = {}

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        for name, value in node.items():
            key = f"{prefix}{name}"
            if key in derived:
                raise ConfigError(f"{source}: {key} cannot be set: {derived[key]}")
            if key in sections:
                if not isinstance(value, dict):
                    raise ConfigError(f"{source}: {key} is a section: expected a mapping")
                walk(value, f"{key}.")
            elif key in by_key:
                if isinstance(value, dict):
                    raise ConfigError(f"{source}: {key} is a setting, not a section")
                out[key] = coerce(value, by_key[key].annotation, f"{source}: {key}")
            else:
                raise ConfigError(f"{source}: unknown setting {key!r}{_nearest(key, by_key)}")

    walk(tree, "")
    return out


def _nearest(key: str, known: Mapping[str, Setting]) -> str:
    """``; did you mean ...`` with the closest valid keys (the leaf name weighs most)."""
    leaf = key.rsplit(".", 1)[-1]
    names = list(known)
    close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
    by_leaf = {k.rsplit(".", 1)[-1]: k for k in names}
    close += [by_leaf[m] for m in difflib.get_close_matches(leaf, list(by_leaf), n=3, cutoff=0.6)]
    unique = list(dict.fromkeys(close))[:3]
    if not unique:
        return " (see podium train --help for the settings)"
    return "; did you mean " + ", ".join(unique) + "?"


def load_file(
    path: Path, settings: Sequence[Setting], *, derived: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The settings a YAML or TOML config file gives (see :func:`file_values`)."""
    return file_values(read_tree(path), settings, derived=derived, source=str(path))


# -- building -----------------------------------------------------------------------------------


def apply(config: Any, values: Mapping[str, Any]) -> Any:
    """``config`` with ``values`` (dotted key → typed value) set, sections rebuilt with
    :func:`dataclasses.replace` so every ``__post_init__`` check runs again."""
    own: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        head, _, rest = key.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            own[head] = value
    for head, sub in nested.items():
        own[head] = apply(getattr(config, head), sub)
    return dataclasses.replace(config, **own) if own else config


def tree(config: Any, settings: Sequence[Setting]) -> dict[str, Any]:
    """The nested plain mapping of ``settings``' values in ``config`` (what a config file
    holds: :func:`load_file` of it gives ``config`` back)."""
    out: dict[str, Any] = {}
    for s in settings:
        node, value = out, config
        for name in s.path[:-1]:
            node = node.setdefault(name, {})
            value = getattr(value, name)
        node[s.path[-1]] = plain(getattr(value, s.path[-1]))
    return out


def flat_values(config: Any, settings: Sequence[Setting]) -> dict[str, Any]:
    """``settings``' values in ``config``, dotted key → plain value (lists as text)."""
    out: dict[str, Any] = {}
    for s in settings:
        value = config
        for name in s.path:
            value = getattr(value, name)
        shown = plain(value)
        out[s.key] = ",".join(str(v) for v in shown) if isinstance(shown, list) else shown
    return out


def dump_yaml(config: Any, settings: Sequence[Setting]) -> str:
    """``config``'s settings as a YAML config file (None as ``null``)."""
    return yaml.safe_dump(tree(config, settings), sort_keys=False, allow_unicode=True)


__all__ = [
    "Setting",
    "add_flags",
    "apply",
    "coerce",
    "dump_yaml",
    "file_values",
    "flag_values",
    "flat_values",
    "given_flag",
    "load_file",
    "plain",
    "read_tree",
    "settings_of",
    "tree",
    "type_name",
]
