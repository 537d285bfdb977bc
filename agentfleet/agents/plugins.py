"""Plugins: agents and tools from installed packages or from folders, loaded in the order they require.

Two sources, one shape (``PluginSpec``: name, version, where from, what it requires, what to import):

* an installed package's entry point in group ``agentfleet.plugins`` naming a ``Plugin``
  declaration (a light object; its ``modules`` hold the agents and tools and are imported
  later, in order), or naming a module (it is the plugin; its distribution gives the version);
* a folder (in ``AGENTFLEET_PLUGIN_PATHS``) with an ``agentfleet-plugin.toml`` manifest:
  ``name``, ``version``, ``entry`` (a module in the folder), ``requires`` (``{name = "range"}``).

Everything that can be checked without importing is checked first (a missing or disabled
dependency, a version outside a range, a cycle, an entry that is not there, a name given
twice); only then are the entries imported, in topological order of ``requires``. Any fault
stops start-up with one ``ConfigurationError`` naming the plugin and the cause, so a worker
never serves a half-loaded tool set. ``AGENTFLEET_PLUGINS_DISABLED`` switches plugins off by
name without a code change.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from types import ModuleType
from typing import Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentfleet.errors import ConfigurationError

# Plugins: the entry point group installed packages declare, and the manifest a plugin folder holds.
PLUGIN_GROUP = "agentfleet.plugins"
PLUGIN_MANIFEST = "agentfleet-plugin.toml"


NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,63}$"


class Plugin(BaseModel):
    """A plugin's declaration, the object an entry point names: cheap to import, it says what to load."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN)
    version: str | None = None  # None: the installed distribution's version
    modules: tuple[str, ...] = Field(min_length=1, description="Modules declaring its agents and tools")
    requires: dict[str, str] = Field(default_factory=dict, description="Other plugins and version ranges")
    description: str = ""


class PluginManifest(BaseModel):
    """``agentfleet-plugin.toml`` in a plugin folder. Unknown keys are configuration errors."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    version: str
    entry: str = Field(description="A module in the folder")
    requires: dict[str, str] = Field(default_factory=dict)
    description: str = ""

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        Version(value)  # InvalidVersion is a ValueError: pydantic reports it
        return value

    @field_validator("entry")
    @classmethod
    def _module_name(cls, value: str) -> str:
        if not all(part.isidentifier() for part in value.split(".")):
            raise ValueError(f"{value!r} is not a module name (a dotted Python name, no path or .py)")
        return value


@dataclass(frozen=True)
class PluginSpec:
    """One discovered plugin, before anything of it is imported."""

    name: str
    version: str
    source: str  # "entry point <dist> <version>" or the folder
    kind: Literal["entry_point", "folder"]
    modules: tuple[str, ...]
    requires: dict[str, str] = field(default_factory=dict)
    folder: Path | None = None
    description: str = ""


@dataclass(frozen=True)
class PluginState:
    spec: PluginSpec
    state: Literal["enabled", "disabled"]


def discover(paths: Sequence[str | Path] = (), *, entry_points: bool = True) -> list[PluginSpec]:
    """Every plugin installed (entry points) or in ``paths`` (a plugin folder, or a folder of them)."""
    found: list[PluginSpec] = []
    if entry_points:
        found += [_from_entry_point(ep) for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP)]
    for path in paths:
        root = Path(path).expanduser().resolve()
        if not root.is_dir():
            raise ConfigurationError(f"plugin path {root} is not a folder")
        if (root / PLUGIN_MANIFEST).is_file():
            found.append(_from_folder(root))
        else:
            found += [_from_folder(d) for d in sorted(root.iterdir()) if (d / PLUGIN_MANIFEST).is_file()]
    return found


def plan(found: Iterable[PluginSpec], disabled: Iterable[str] = ()) -> list[PluginState]:
    """Every plugin with its state, enabled ones in load order; a fault is a ConfigurationError naming it."""
    by_name: dict[str, PluginSpec] = {}
    for spec in found:
        if spec.name in by_name:
            raise ConfigurationError(f"plugin {spec.name!r} is provided twice: by {by_name[spec.name].source} and "
                                     f"by {spec.source}")
        by_name[spec.name] = spec
    off = set(disabled)
    unknown = sorted(off - set(by_name))
    if unknown:
        raise ConfigurationError(f"AGENTFLEET_PLUGINS_DISABLED names {', '.join(map(repr, unknown))}, which is not "
                                 f"a plugin here (found: {', '.join(sorted(by_name)) or 'none'})")
    graph: dict[str, set[str]] = {}
    for name, spec in by_name.items():
        if name in off:
            continue
        for needed, wanted in spec.requires.items():
            _check_requirement(spec, needed, wanted, by_name, off)
        graph[name] = set(spec.requires)
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        ring = list(reversed(exc.args[1]))[:-1]  # each requires the next; the first repeats at the end
        start = ring.index(min(ring))
        ring = ring[start:] + ring[:start] + [min(ring)]
        raise ConfigurationError(f"plugins require each other in a cycle: {' requires '.join(map(repr, ring))}"
                                 ) from None
    states = [PluginState(by_name[n], "enabled") for n in order]
    return states + [PluginState(by_name[n], "disabled") for n in sorted(off)]


def load(states: Iterable[PluginState]) -> list[str]:
    """Import the enabled plugins' modules in order; the names of the modules imported."""
    imported: list[str] = []
    for state in states:
        if state.state != "enabled":
            continue
        spec = state.spec
        if spec.folder is not None and str(spec.folder) not in sys.path:
            sys.path.append(str(spec.folder))
        for module in spec.modules:
            _import(spec, module)
            imported.append(module)
    return imported


def load_plugins(paths: Sequence[str | Path], disabled: Iterable[str], *, entry_points: bool = True
                 ) -> list[PluginState]:
    """Discover, order and load: what a worker does at start-up."""
    states = plan(discover(paths, entry_points=entry_points), disabled)
    load(states)
    return states


def _check_requirement(spec: PluginSpec, needed: str, wanted: str, by_name: dict[str, PluginSpec],
                       off: set[str]) -> None:
    allowed = SpecifierSet(wanted)  # checked when the plugin was discovered
    target = by_name.get(needed)
    if target is None:
        raise ConfigurationError(f"plugin {spec.name!r} requires {needed!r} ({wanted or 'any version'}), which is "
                                 "not installed")
    if needed in off:
        raise ConfigurationError(f"plugin {spec.name!r} requires {needed!r}, which is disabled "
                                 "(AGENTFLEET_PLUGINS_DISABLED)")
    if not allowed.contains(Version(target.version), prereleases=True):
        raise ConfigurationError(f"plugin {spec.name!r} requires {needed!r} {wanted}, but {needed!r} is "
                                 f"{target.version} ({target.source})")


def _import(spec: PluginSpec, module: str) -> ModuleType:
    if spec.folder is not None:
        existing = sys.modules.get(module)
        where = getattr(existing, "__file__", None) if existing is not None else None
        if where is not None and spec.folder not in Path(where).resolve().parents:
            raise ConfigurationError(f"plugin {spec.name!r}: its entry module {module!r} is already loaded from "
                                     f"{where}; rename the module")
    try:
        return importlib.import_module(module)
    except ConfigurationError as exc:
        raise ConfigurationError(f"plugin {spec.name!r} failed to load: {exc}") from exc
    except Exception as exc:
        raise ConfigurationError(f"plugin {spec.name!r} failed to load: {type(exc).__name__}: {exc}") from exc


def _from_entry_point(ep: importlib.metadata.EntryPoint) -> PluginSpec:
    dist = ep.dist
    dist_version = dist.version if dist is not None else "0"
    source = f"entry point {ep.value} ({dist.name if dist else '?'} {dist_version})"
    try:
        target = ep.load()
    except Exception as exc:
        raise ConfigurationError(f"plugin {ep.name!r} ({source}): its entry point cannot be loaded: "
                                 f"{type(exc).__name__}: {exc}") from exc
    if isinstance(target, ModuleType):
        declared = Plugin(name=ep.name, version=dist_version, modules=(target.__name__,))
    elif isinstance(target, Plugin):
        declared = target
    else:
        raise ConfigurationError(f"plugin {ep.name!r} ({source}): the entry point names a "
                                 f"{type(target).__name__}, not a module or an agentfleet Plugin")
    if declared.name != ep.name:
        raise ConfigurationError(f"plugin {ep.name!r} ({source}): its declaration is named {declared.name!r}")
    version = declared.version or dist_version
    _version(declared.name, version, source)
    for needed, wanted in declared.requires.items():
        _spec(declared.name, needed, wanted)
    return PluginSpec(declared.name, version, source, "entry_point", declared.modules, dict(declared.requires),
                      description=declared.description)


def _from_folder(folder: Path) -> PluginSpec:
    file = folder / PLUGIN_MANIFEST
    try:
        manifest = PluginManifest.model_validate(tomllib.loads(file.read_text()))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"plugin folder {folder}: {PLUGIN_MANIFEST}: {exc}") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ConfigurationError(f"plugin folder {folder}: {PLUGIN_MANIFEST}: {where}: {err['msg']}") from None
    top = manifest.entry.split(".")[0]
    if not ((folder / f"{top}.py").is_file() or (folder / top / "__init__.py").is_file()):
        raise ConfigurationError(f"plugin {manifest.name!r} (folder {folder}): its entry {manifest.entry!r} is not "
                                 f"a module in the folder (no {top}.py or {top}/__init__.py)")
    shadow = _installed_elsewhere(top, folder)
    if shadow is not None:
        raise ConfigurationError(f"plugin {manifest.name!r} (folder {folder}): its entry module {top!r} is the name "
                                 f"of an installed module ({shadow}), which would be imported instead; rename the "
                                 "module")
    for needed, wanted in manifest.requires.items():
        _spec(manifest.name, needed, wanted)
    return PluginSpec(manifest.name, manifest.version, str(folder), "folder", (manifest.entry,),
                      dict(manifest.requires), folder, manifest.description)


def _installed_elsewhere(top: str, folder: Path) -> str | None:
    """Where Python would import ``top`` from instead of the plugin's folder (which is appended to the path),
    or None: a plugin module named like an installed one (``pytest``) would silently never run."""
    if top in sys.builtin_module_names:
        return "built in"
    loaded = sys.modules.get(top)
    try:
        spec = None if loaded is not None else importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    origin = getattr(loaded, "__file__", None) if loaded is not None else (spec.origin if spec else None)
    if origin is None or origin in ("built-in", "frozen"):
        return origin if loaded is not None or spec is not None else None
    where = Path(origin).resolve()
    return None if folder.resolve() in where.parents else str(where)


def _version(name: str, version: str, source: str) -> None:
    try:
        Version(version)
    except InvalidVersion:
        raise ConfigurationError(f"plugin {name!r} ({source}): version {version!r} is not a version") from None


def _spec(name: str, needed: str, wanted: str) -> None:
    try:
        SpecifierSet(wanted)
    except InvalidSpecifier:
        raise ConfigurationError(f"plugin {name!r}: requirement {needed!r} has an invalid version range "
                                 f"{wanted!r}") from None
