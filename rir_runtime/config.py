"""One config mechanism for every stage: typed dataclasses, a `--config` YAML, CLI overrides.

Like TRL's `TrlParser.parse_args_and_config`: each dataclass field becomes a `--flag`
(underscores become dashes) with its `metadata["help"]` and `metadata["choices"]`; the YAML file
sets defaults; flags on the command line win. Unknown YAML keys and unknown flags are errors that
name the key and suggest the nearest valid one. Validation lives in each dataclass's
`__post_init__`, so a config built in Python is checked the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from rir_runtime.errors import UserInputError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


def _base_type(tp: Any) -> tuple[Any, bool]:
    """(underlying type, is_optional) for `X | None` style annotations."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Coerce a YAML or CLI value to the field's type, with an error that names the key."""
    base, optional = _base_type(tp)
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
        return None
    try:
        if typing.get_origin(base) is list:
            (item_type,) = typing.get_args(base) or (str,)
            # nested sections: YAML mappings, or JSON on the CLI
            if isinstance(item_type, type) and dataclasses.is_dataclass(item_type):
                items = json.loads(value) if isinstance(value, str) else value
                return [
                    v if isinstance(v, item_type) else build_config(item_type, v, source=f"'{key}' entry")
                    for v in items
                ]
            items = value.split(",") if isinstance(value, str) else list(value)
            return [
                item_type(str(v).strip()) if item_type is not str else str(v).strip() for v in items if str(v).strip()
            ]
        if base is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if base in (int, float, str):
            return base(value)
    except (TypeError, ValueError, AttributeError):
        raise UserInputError(
            f"config key '{key}': cannot read {value!r} as {getattr(base, '__name__', base)}"
        ) from None
    return value


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, with one clear error for a missing or malformed file."""
    path = Path(path)
    if not path.is_file():
        raise UserInputError(f"config file {path} does not exist: check the path passed to --config")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise UserInputError(
            f"config file {path} is not valid YAML ({str(err).splitlines()[0]}): fix the syntax"
        ) from None
    if not isinstance(data, dict):
        raise UserInputError(f"config file {path} must hold a mapping of keys to values, not {type(data).__name__}")
    return data


def build_config(cls: type[T], values: dict[str, Any], source: str = "config") -> T:
    """Instantiate dataclass `cls` from a mapping, rejecting unknown keys with a suggestion."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for raw_key, value in values.items():
        key = str(raw_key).replace("-", "_")
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise UserInputError(f"unknown key '{raw_key}' in {source}.{hint} Valid keys: {', '.join(fields)}")
        kwargs[key] = _convert(value, hints[key], key)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as err:
        raise UserInputError(f"invalid {source}: {err}") from None


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls: type[DataclassInstance]) -> None:
    """Add one `--flag` per field, without defaults (absent flags leave the YAML value alone)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        base, _ = _base_type(hints[f.name])
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        if f.default is not dataclasses.MISSING and f.default is not None:
            help_text += f" (default: {f.default})"
        kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": help_text}
        if base is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["metavar"] = f.name.upper()
            if f.metadata.get("choices"):
                kwargs["choices"] = f.metadata["choices"]
        parser.add_argument(flag, **kwargs)


def parse_config(cls: type[T], args: argparse.Namespace) -> T:
    """Merge `--config` YAML (if given) with explicit flags from a parsed namespace."""
    values: dict[str, Any] = load_yaml(args.config) if getattr(args, "config", None) else {}
    names = {f.name for f in dataclasses.fields(cls)}
    values.update({k: v for k, v in vars(args).items() if k in names})
    return build_config(cls, values, source=f"config {args.config}" if getattr(args, "config", None) else "flags")


def config_to_dict(config: DataclassInstance) -> dict[str, Any]:
    """A JSON-safe dict of a config dataclass, saved next to every output."""
    return dataclasses.asdict(config)
