"""Pass options: the declaration (`Option`) and the typed store the passes read them from.

One `Option` gives a pass its ``--flag``, its keyword of ``dmlopt.optimize``, its line in
``dmlopt passes`` and, when tunable, its candidates.  The values live in an `OptionStore`, keyed
by pass name: each pass reads only its own `PassOptions`.  A value is converted with the option's
`type` and checked against its `choices` once, when the store is built, so a bad value is a
one-line usage error before any work.  What the user set (`settings`) and what the engine chose
for it (`choices`: tuning, the fp16 repair) are kept apart, so neither can overwrite the other
unseen and the report can tell them apart.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Callable, Iterable, Mapping, Sequence

from dmlopt.errors import UsageError

_TRUE, _FALSE = ("true", "on", "yes", "1"), ("false", "off", "no", "0")
_KINDS = {int: "an integer", float: "a number"}


@dataclasses.dataclass(frozen=True)
class Option:
    """A user-facing knob of a pass (``--leaky-relu auto``, ``leaky_relu="auto"``)."""

    name: str  # python name; the CLI flag is "--" + name with "_" -> "-"
    default: Any
    help: str
    choices: Sequence[str] | None = None
    type: Callable[[str], Any] = str
    # "auto" set by the user, or any option under --tune, is measured on the target (dmlopt.engine.tune).
    tunable: bool = False
    # What "auto" means when nothing is measured: target -> choice, or target -> {precision -> choice}
    # where the better choice depends on the precision the model is written in (float32, float16).
    auto_default: Mapping[str, Any] | None = None
    # Where those defaults come from, per target (what was measured, or the reasoning): in the report.
    auto_default_source: Mapping[str, str] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def convert(self, value: Any) -> Any:
        """`value` as this option holds it (its `type`, one of its `choices`; "auto" where tunable),
        or a one-line UsageError naming the flag."""
        if self.choices is not None:
            if value not in self.choices:
                raise UsageError(f"{self.flag}: '{value}' is not one of {', '.join(self.choices)}")
            return value
        if self.tunable and value == "auto":
            return value
        if self.type is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, int) and value in (0, 1) or isinstance(value, str) and value.lower() in _TRUE + _FALSE:
                return str(value).lower() in _TRUE
            raise UsageError(f"{self.flag}: '{value}' is not true or false")
        if self.type is str:
            if isinstance(value, str):
                return value
            if isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(v, str) for v in value):
                return tuple(value)  # names given one by one (the API: a name may hold a comma)
            raise UsageError(f"{self.flag}: '{value}' is not text")
        kind = _KINDS.get(self.type, f"a {self.type.__name__}")
        if isinstance(value, bool):
            raise UsageError(f"{self.flag}: '{value}' is not {kind}")
        try:
            return self.type(value)
        except (TypeError, ValueError):
            raise UsageError(f"{self.flag}: '{value}' is not {kind}") from None

    def default_for(self, target: str, precision: str = "float32") -> Any:
        """The choice "auto" stands for on `target` when nothing is measured, for a model written in `precision`."""
        default = (self.auto_default or {}).get(target)
        if isinstance(default, Mapping):
            default = default.get(precision, default.get("float32"))
        if default is not None:
            return default
        if self.default != "auto":
            return self.default
        choices = [c for c in (self.choices or ()) if c != "auto"]
        return "keep" if "keep" in choices else choices[0]

    def default_provenance(self, target: str, precision: str = "float32") -> str:
        """Says which default applied and why: per target and, where it differs, per precision."""
        per_precision = isinstance((self.auto_default or {}).get(target), Mapping)
        where = f"--target {target}" + (f" in {precision}" if per_precision else "")
        if self.auto_default is None or target not in self.auto_default:
            return "the option's default"
        source = (self.auto_default_source or {}).get(target)
        return f"the documented default for {where}" + (f" ({source})" if source else "")


def check_unique_options(classes: Iterable[Any]) -> None:
    """Refuse (a dmlopt bug, at load) two passes declaring the same option: the CLI flags and the
    keywords of ``dmlopt.optimize`` are flat, so one would silently set the other."""
    owner: dict[str, str] = {}
    for cls in classes:
        for opt in cls.options:
            if opt.name in owner and owner[opt.name] != cls.name:
                raise TypeError(f"passes '{owner[opt.name]}' and '{cls.name}' both declare option "
                                f"'{opt.name}' ({opt.flag}): option names must be unique")
            owner[opt.name] = cls.name


def _frozen(values: Mapping[str, Any]) -> Mapping[str, Any]:
    return types.MappingProxyType(dict(values))


@dataclasses.dataclass(frozen=True)
class PassOptions:
    """One pass's option values: the user's `settings` and, over them, the engine's `choices`.

    A value is the engine's choice where there is one, else the user's setting, else the
    option's declared default.  Both are converted and checked when built (`build`, `chose`).
    """

    pass_name: str
    declared: tuple[Option, ...]
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    choices: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def build(cls, pass_name: str, declared: Sequence[Option], settings: Mapping[str, Any]) -> "PassOptions":
        """The user's `settings` (None: unset) converted and checked; a name the pass does not declare is refused."""
        by_name = {opt.name: opt for opt in declared}
        checked = {}
        for name, value in settings.items():
            if value is None:
                continue
            if name not in by_name:
                raise UsageError(f"unknown option '{name}' (known: {', '.join(sorted(by_name)) or 'none'})")
            checked[name] = by_name[name].convert(value)
        return cls(pass_name, tuple(declared), _frozen(checked), _frozen({}))

    def option(self, name: str) -> Option:
        for opt in self.declared:
            if opt.name == name:
                return opt
        raise KeyError(f"{self.pass_name} has no option {name!r}")

    def __getitem__(self, name: str) -> Any:
        opt = self.option(name)
        if name in self.choices:
            return self.choices[name]
        return self.settings.get(name, opt.default)

    def is_set(self, name: str) -> bool:
        """Whether the user set option `name` (to any value, "auto" included)."""
        return name in self.settings

    def resolved_by(self, name: str) -> str:
        """Who gave option `name` its value: "engine" (tuning, the fp16 repair), "user" or "default"."""
        self.option(name)
        return "engine" if name in self.choices else "user" if name in self.settings else "default"

    def values(self) -> dict[str, Any]:
        """Every declared option and its value."""
        return {opt.name: self[opt.name] for opt in self.declared}

    def chose(self, name: str, value: Any) -> "PassOptions":
        """A copy with the engine's choice `value` for option `name`; the user's settings stay as they are."""
        return dataclasses.replace(self, choices=_frozen({**self.choices, name: self.option(name).convert(value)}))


@dataclasses.dataclass(frozen=True)
class OptionStore:
    """Every pass's `PassOptions` by pass name.

    `loose`: values by option name alone, for a pass run by itself (a test, a benchmark:
    ``PassContext(options={"leaky_relu": "decompose"})``); each pass takes the names it
    declares when it reads them.  The pipeline builds its store with `build` instead.
    """

    passes: Mapping[str, PassOptions] = dataclasses.field(default_factory=dict)
    loose: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def build(cls, pass_classes: Iterable[Any], settings: Mapping[str, Any]) -> "OptionStore":
        """The user's settings by option name (the flat keywords and flags; names are unique across
        passes) given to the pass that declares each, converted and checked (UsageError)."""
        pass_classes = list(pass_classes)
        check_unique_options(pass_classes)  # a flat name must name one option
        owner = {opt.name: cls_.name for cls_ in pass_classes for opt in cls_.options}
        unknown = [name for name, value in settings.items() if value is not None and name not in owner]
        if unknown:
            raise UsageError(f"unknown option '{unknown[0]}' (known: {', '.join(sorted(owner)) or 'none'})")
        return cls(_frozen({
            p.name: PassOptions.build(p.name, p.options, {n: v for n, v in settings.items() if owner.get(n) == p.name})
            for p in pass_classes}))

    @classmethod
    def of_names(cls, values: Mapping[str, Any]) -> "OptionStore":
        return cls(loose=_frozen(values))

    def of(self, pass_class: Any) -> PassOptions:
        """The options of `pass_class` (a DmlPass class): its own, no other pass's."""
        found = self.passes.get(pass_class.name)
        if found is not None:
            return found
        declared = {opt.name for opt in pass_class.options}
        return PassOptions.build(pass_class.name, pass_class.options,
                                 {n: v for n, v in self.loose.items() if n in declared})

    def value(self, pass_name: str, name: str, default: Any = None) -> Any:
        """Option `name` of pass `pass_name`; `default` where the store holds no such pass."""
        found = self.passes.get(pass_name)
        return found[name] if found is not None else self.loose.get(name, default)

    def chose(self, pass_name: str, name: str, value: Any) -> "OptionStore":
        """A copy with the engine's choice for one option (the pass must be in the store)."""
        return dataclasses.replace(self, passes=_frozen({**self.passes, pass_name: self.passes[pass_name].chose(name, value)}))

    def with_choices(self, choices: Mapping[str, Mapping[str, Any]]) -> "OptionStore":
        """A copy with the engine's choices, pass name -> option -> value."""
        store = self
        for pass_name, values in choices.items():
            for name, value in values.items():
                store = store.chose(pass_name, name, value)
        return store

    def settings(self) -> dict[str, dict[str, Any]]:
        """What the user set, pass name -> option -> value (passes with none left out)."""
        return {p: dict(o.settings) for p, o in self.passes.items() if o.settings}

    def choices(self) -> dict[str, dict[str, Any]]:
        """What the engine chose, pass name -> option -> value (passes with none left out)."""
        return {p: dict(o.choices) for p, o in self.passes.items() if o.choices}
