"""One config mechanism for every stage: typed dataclasses, a `--config` YAML, CLI overrides.

Like TRL's `TrlParser.parse_args_and_config`: each dataclass field becomes a flag in TRL's
underscore spelling (`--max_steps`) with the dashed spelling as an alias (`--max-steps`), its
`metadata["help"]` and its allowed values (`metadata["choices"]`); the YAML file sets defaults;
flags on the command line win. Lists take comma lists (`--methods react,rir`) and space lists
(`--methods react rir`, TRL's `nargs="+"`); booleans take `--flag`, `--flag false` or `--no_flag`.
The output folder keeps the key `out`, with TRL's `output_dir` as its alias. Unknown YAML keys and
unknown flags are errors that name the key and suggest the nearest valid one. Validation lives in
each dataclass's `__post_init__`, so a config built in Python is checked the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import yaml

from rir_runtime.errors import UserInputError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")

# Other names of a config key, accepted as flags and YAML keys: TRL calls the output folder output_dir.
KEY_ALIASES = {"output_dir": "out"}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _base_type(tp: Any) -> tuple[Any, bool]:
    """(underlying type, is_optional) for `X | None` style annotations."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


def _list_item_type(base: Any) -> Any | None:
    """The item type of a `list[X]` annotation, else None."""
    if typing.get_origin(base) is not list:
        return None
    (item_type,) = typing.get_args(base) or (str,)
    return item_type


def _is_section(item_type: Any) -> bool:
    """A list of nested dataclasses (YAML mappings, or JSON on the CLI), not of plain names."""
    return isinstance(item_type, type) and dataclasses.is_dataclass(item_type)


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Coerce a YAML or CLI value to the field's type, with an error that names the key."""
    base, optional = _base_type(tp)
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
        return None
    try:
        item_type = _list_item_type(base)
        if item_type is not None:
            if _is_section(item_type):
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
            return _read_bool(str(value))
        if base in (int, float, str):
            return base(value)
    except (TypeError, ValueError, AttributeError):
        raise UserInputError(
            f"config key '{key}': cannot read {value!r} as {getattr(base, '__name__', base)}"
        ) from None
    return value


def _read_bool(text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError(text)


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


def _canonical_key(raw_key: Any, names: Sequence[str]) -> str:
    """`max-steps` -> `max_steps`, `output_dir` -> `out` (when the config has `out`); unknown keys stay as given."""
    key = str(raw_key).replace("-", "_")
    if key not in names and KEY_ALIASES.get(key) in names:
        return KEY_ALIASES[key]
    return key if key in names else str(raw_key)


def _canonical_keys(values: Mapping[Any, Any], names: Sequence[str], source: str) -> dict[str, Any]:
    """The mapping under canonical keys; two spellings of one key are an error, not a silent pick."""
    out: dict[str, Any] = {}
    spelled: dict[str, Any] = {}
    for raw_key, value in values.items():
        key = _canonical_key(raw_key, names)
        if key in out:
            raise UserInputError(f"{source} sets '{key}' twice (as '{spelled[key]}' and '{raw_key}'): keep one")
        out[key], spelled[key] = value, raw_key
    return out


def build_config(cls: type[T], values: dict[str, Any], source: str = "config") -> T:
    """Instantiate dataclass `cls` from a mapping, rejecting unknown keys with a suggestion."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in _canonical_keys(values, list(fields), source).items():
        if key not in fields:
            close = difflib.get_close_matches(key.replace("-", "_"), list(fields), n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise UserInputError(f"unknown key '{key}' in {source}.{hint} Valid keys: {', '.join(fields)}")
        kwargs[key] = _convert(value, hints[key], key)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as err:
        raise UserInputError(f"invalid {source}: {err}") from None


def parse_config(cls: type[T], args: argparse.Namespace) -> T:
    """Merge `--config` YAML (if given) with explicit flags from a parsed namespace."""
    config = getattr(args, "config", None)
    source = f"config {config}" if config else "flags"
    names = [f.name for f in dataclasses.fields(cls)]
    values = _canonical_keys(load_yaml(config), names, source) if config else {}
    values.update({k: v for k, v in vars(args).items() if k in names})
    return build_config(cls, values, source=source)


def config_to_dict(config: DataclassInstance) -> dict[str, Any]:
    """A JSON-safe dict of a config dataclass, saved next to every output."""
    return dataclasses.asdict(config)


# --- flags ---------------------------------------------------------------------------------------------
def spellings(name: str) -> list[str]:
    """`max_steps` -> ['--max_steps', '--max-steps']: TRL's spelling first, the dashed one as an alias."""
    flags = ["--" + name]
    if "_" in name:
        flags.append("--" + name.replace("_", "-"))
    return flags


def _bool_flag(text: str) -> bool:
    try:
        return _read_bool(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected true or false, not {text!r}") from None


class _ListAction(argparse.Action):
    """A list flag: comma lists and space lists both end as one comma string, read by `_convert`."""

    def __init__(self, *args: Any, allowed: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.allowed = [str(a) for a in allowed]

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        items = [item.strip() for value in values for item in str(value).split(",")]
        bad = [item for item in items if item and self.allowed and item not in self.allowed]
        if bad:
            parser.error(f"argument {option}: invalid choice {bad[0]!r} (choose from {', '.join(self.allowed)})")
        setattr(namespace, self.dest, ",".join(items))


def _shown(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _help(f: dataclasses.Field[Any], base: Any, names: Sequence[str]) -> str:
    """The field's help, then its allowed values (or known names), its default and its off switch."""
    notes = []
    if f.metadata.get("choices"):
        notes.append("choices: " + ", ".join(str(c) for c in f.metadata["choices"]))
    elif names and not all(name in f.metadata.get("help", "") for name in names):
        notes.append("names: " + ", ".join(names))
    if f.default is not dataclasses.MISSING and f.default is not None:
        notes.append(f"default: {_shown(f.default)}")
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
        if default and not any(dataclasses.is_dataclass(v) for v in default):
            notes.append(f"default: {_shown(default)}")
    if base is bool:
        notes.append(f"--no_{f.name} turns it off")
    text = f.metadata.get("help", "") + (f" ({'; '.join(notes)})" if notes else "")
    return text.replace("%", "%%")  # argparse %-formats help strings


def add_dataclass_arguments(
    parser: argparse.ArgumentParser, cls: type[DataclassInstance], names: Mapping[str, Sequence[str]] | None = None
) -> None:
    """Add flags for every field, without defaults (absent flags leave the YAML value alone).

    `names` maps a free-form field (one not limited by `choices`, such as methods or controllers)
    to the names it knows, shown in its help but not enforced here.
    """
    hints = typing.get_type_hints(cls)
    field_names = [f.name for f in dataclasses.fields(cls)]
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        base, _ = _base_type(hints[f.name])
        flags = spellings(f.name)
        for alias, key in KEY_ALIASES.items():
            if key == f.name and alias not in field_names:
                flags += spellings(alias)
        kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS}
        kwargs["help"] = _help(f, base, (names or {}).get(f.name, ()))
        choices = f.metadata.get("choices")
        item_type = _list_item_type(base)
        if base is bool:
            kwargs.update(nargs="?", const=True, type=_bool_flag, metavar="true|false")
        elif item_type is not None and not _is_section(item_type):
            kwargs.update(nargs="+", action=_ListAction, allowed=choices or (), metavar=f.name.upper())
        else:
            kwargs.update(metavar=f.name.upper(), choices=choices or None)
        parser.add_argument(*flags, **kwargs)
        if base is bool:
            # store_false's own default would be True, set even when no flag is given: suppress it too
            parser.add_argument(
                *spellings(f"no_{f.name}"),
                dest=f.name,
                action="store_false",
                default=argparse.SUPPRESS,
                help=argparse.SUPPRESS,
            )


class AliasHelpFormatter(argparse.HelpFormatter):
    """`--max_steps, --max-steps MAX_STEPS` instead of repeating the metavar after every spelling (as 3.13 does)."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings or action.nargs == 0:
            return super()._format_action_invocation(action)
        default = self._get_default_metavar_for_optional(action)
        return ", ".join(action.option_strings) + " " + self._format_args(action, default)


class FlagParser(argparse.ArgumentParser):
    """An ArgumentParser whose unknown flags are errors naming the nearest valid flag.

    Abbreviations are off: with two spellings per flag every prefix would be ambiguous, and a prefix
    that works today silently changes meaning when a field is added.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", AliasHelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        # A subcommand's leftovers would reach the top parser, which no longer knows the subcommand's flags.
        parsed, extras = super().parse_known_args(args, namespace)
        flags = [a for a in extras if len(a) > 1 and a[0] in self.prefix_chars]
        if flags:
            self.unknown_flag(flags[0])
        return parsed, extras

    def unknown_flag(self, arg: str) -> NoReturn:
        flag = arg.partition("=")[0]
        known = {
            a.option_strings[0].lstrip(self.prefix_chars): a.option_strings[0]
            for a in self._actions
            if a.option_strings
        }
        close = difflib.get_close_matches(flag.lstrip(self.prefix_chars).replace("-", "_"), list(known), n=1)
        hint = f" Did you mean {known[close[0]]}?" if close else ""
        self.error(f"unknown flag {flag}.{hint} See {self.prog} --help for every flag")
