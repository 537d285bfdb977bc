"""Plugins load in the order they require; every way they cannot is one error naming the plugin and the cause."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentfleet.agents.plugins import discover, load, load_plugins, plan
from agentfleet.agents.registry import registry
from agentfleet.cli import app
from agentfleet.errors import ConfigurationError

imported: list[str] = []  # plugin modules append their name here as they are imported, to show the order


@pytest.fixture
def tag() -> str:
    return "p" + uuid.uuid4().hex[:8]  # module names unique per test: Python caches imports


@pytest.fixture
def clean_path() -> Iterator[None]:
    before = list(sys.path)
    imported.clear()
    yield
    sys.path[:] = before


def folder(root: Path, name: str, version: str = "1.0.0", *, entry: str | None = None, requires: dict | None = None,
           body: str | None = None, extra: str = "") -> Path:
    """A plugin folder whose entry module records that it was imported."""
    d = root / name
    d.mkdir(parents=True)
    entry = entry or f"{name.replace('-', '_')}_mod"
    needs = "".join(f'{k} = "{v}"\n' for k, v in (requires or {}).items())
    (d / "agentfleet-plugin.toml").write_text(f'name = "{name}"\nversion = "{version}"\nentry = "{entry}"\n{extra}'
                                              f"[requires]\n{needs}")
    (d / f"{entry}.py").write_text(body if body is not None else
                                   f"from tests.agents.test_plugins import imported\nimported.append({name!r})\n")
    return d


def test_plugins_load_in_the_order_they_require(tmp_path: Path, tag: str, clean_path: None) -> None:
    folder(tmp_path, f"{tag}-c", requires={f"{tag}-b": ">=1.0"})
    folder(tmp_path, f"{tag}-a")
    folder(tmp_path, f"{tag}-b", "1.5.0", requires={f"{tag}-a": ">=1,<2"})
    states = load_plugins([tmp_path], [], entry_points=False)
    assert [s.spec.name for s in states] == [f"{tag}-a", f"{tag}-b", f"{tag}-c"]
    assert imported == [f"{tag}-a", f"{tag}-b", f"{tag}-c"]


def test_a_plugin_declares_agents_and_manifest_tools_that_the_fleet_then_knows(tmp_path: Path, tag: str,
                                                                              clean_path: None) -> None:
    examples = Path(__file__).resolve().parents[2] / "agentfleet" / "examples" / "polyglot" / "tools"
    body = f'''
from pathlib import Path
from agentfleet import Agent, ScriptedModel, load_tool_manifest
counter = load_tool_manifest({str(examples / "word_count_bash.tool.toml")!r})
Agent("{tag}_agent", instructions="count", model=ScriptedModel([]), goal_schema={{"type": "object"}},
      result_schema={{"type": "object"}}, tools=[counter])
'''
    folder(tmp_path, tag, body=body)
    load(plan(discover([tmp_path], entry_points=False)))
    agent = registry.get(f"{tag}_agent")
    assert agent is not None and agent.tools["word_count_bash"].kind == "subprocess"


@pytest.mark.parametrize("case", ["missing", "version", "cycle", "entry", "import", "disabled_dependency",
                                  "twice", "manifest", "shadowed"])
def test_each_cause_of_a_failed_load_is_one_clear_error(tmp_path: Path, tag: str, clean_path: None,
                                                        case: str) -> None:
    a, b = f"{tag}-a", f"{tag}-b"
    disabled: list[str] = []
    if case == "missing":
        folder(tmp_path, a, requires={"kb-search": ">=2"})
        expected = f"plugin '{a}' requires 'kb-search' (>=2), which is not installed"
    elif case == "version":
        folder(tmp_path, a, "1.4.0")
        folder(tmp_path, b, requires={a: ">=2.0"})
        expected = f"plugin '{b}' requires '{a}' >=2.0, but '{a}' is 1.4.0 ({tmp_path / a})"
    elif case == "cycle":
        folder(tmp_path, a, requires={b: ">=1"})
        folder(tmp_path, b, requires={a: ">=1"})
        expected = f"plugins require each other in a cycle: '{a}' requires '{b}' requires '{a}'"
    elif case == "entry":
        d = folder(tmp_path, a)
        (d / "agentfleet-plugin.toml").write_text(f'name = "{a}"\nversion = "1.0"\nentry = "nowhere"\n')
        expected = (f"plugin '{a}' (folder {d}): its entry 'nowhere' is not a module in the folder (no nowhere.py "
                    "or nowhere/__init__.py)")
    elif case == "import":
        folder(tmp_path, a, body="import no_such_module_here\n")
        expected = f"plugin '{a}' failed to load: ModuleNotFoundError: No module named 'no_such_module_here'"
    elif case == "disabled_dependency":
        folder(tmp_path, a)
        folder(tmp_path, b, requires={a: ""})
        disabled = [a]
        expected = f"plugin '{b}' requires '{a}', which is disabled (AGENTFLEET_PLUGINS_DISABLED)"
    elif case == "shadowed":  # Containment 20: the installed pytest was imported and the plugin never ran
        d = folder(tmp_path, a, entry="typer")
        import typer

        expected = (f"plugin '{a}' (folder {d}): its entry module 'typer' is the name of an installed module "
                    f"({Path(typer.__file__).resolve()}), which would be imported instead; rename the module")
    elif case == "twice":
        folder(tmp_path / "one", a)
        folder(tmp_path / "two", a)
        expected = f"plugin '{a}' is provided twice: by {tmp_path / 'one' / a} and by {tmp_path / 'two' / a}"
    else:
        folder(tmp_path, a, extra='colour = "red"\n')
        expected = f"plugin folder {tmp_path / a}: agentfleet-plugin.toml: colour: Extra inputs are not permitted"
    paths = [tmp_path / "one", tmp_path / "two"] if case == "twice" else [tmp_path]
    with pytest.raises(ConfigurationError) as err:
        load_plugins(paths, disabled, entry_points=False)
    assert str(err.value) == expected
    if case != "import":
        assert imported == []  # found before anything was imported: nothing half-loaded


def test_a_disabled_plugin_is_listed_but_not_loaded(tmp_path: Path, tag: str, clean_path: None) -> None:
    folder(tmp_path, f"{tag}-a")
    folder(tmp_path, f"{tag}-b")
    states = load_plugins([tmp_path], [f"{tag}-b"], entry_points=False)
    assert [(s.spec.name, s.state) for s in states] == [(f"{tag}-a", "enabled"), (f"{tag}-b", "disabled")]
    assert imported == [f"{tag}-a"]
    with pytest.raises(ConfigurationError, match="AGENTFLEET_PLUGINS_DISABLED names 'nope'"):
        plan(discover([tmp_path], entry_points=False), ["nope"])


def test_installed_packages_declare_plugins_through_entry_points(tmp_path: Path, tag: str, clean_path: None) -> None:
    site = tmp_path / "site"
    pkg = site / f"{tag}_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "from agentfleet import Plugin\n"
        f"plugin = Plugin(name='{tag}-ep', modules=['{tag}_pkg.agents'], requires={{'{tag}-base': '~=1.0'}})\n")
    (pkg / "agents.py").write_text(f"from tests.agents.test_plugins import imported\nimported.append('{tag}-ep')\n")
    info = site / f"{tag}_pkg-2.3.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {tag}-pkg\nVersion: 2.3.0\n")
    (info / "entry_points.txt").write_text(f"[agentfleet.plugins]\n{tag}-ep = {tag}_pkg:plugin\n")
    folder(tmp_path / "folders", f"{tag}-base", "1.2.0")
    sys.path.insert(0, str(site))
    states = load_plugins([tmp_path / "folders"], [])
    mine = [s for s in states if s.spec.name.startswith(tag)]
    assert [(s.spec.name, s.spec.version, s.spec.kind) for s in mine] == [
        (f"{tag}-base", "1.2.0", "folder"), (f"{tag}-ep", "2.3.0", "entry_point")]
    assert "entry point" in mine[1].spec.source and imported == [f"{tag}-base", f"{tag}-ep"]


def test_agentfleet_plugins_lists_source_version_and_state(tmp_path: Path, tag: str, clean_path: None,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from agentfleet.config.settings import get_settings

    folder(tmp_path, f"{tag}-a", "0.3.0")
    folder(tmp_path, f"{tag}-b", "1.0.0", requires={f"{tag}-a": "<1"})
    monkeypatch.setenv("AGENTFLEET_PLUGIN_PATHS", str(tmp_path))
    monkeypatch.setenv("AGENTFLEET_PLUGIN_ENTRY_POINTS", "false")
    get_settings.cache_clear()
    try:
        listed = CliRunner().invoke(app, ["plugins", "--json"])
        assert listed.exit_code == 0, listed.output
        rows = json.loads(listed.output)
        assert [(r["name"], r["version"], r["state"], r["source"]) for r in rows] == [
            (f"{tag}-a", "0.3.0", "enabled", str(tmp_path / f"{tag}-a")),
            (f"{tag}-b", "1.0.0", "enabled", str(tmp_path / f"{tag}-b"))]
        monkeypatch.setenv("AGENTFLEET_PLUGINS_DISABLED", f"{tag}-a")
        get_settings.cache_clear()
        refused = CliRunner().invoke(app, ["plugins"])
        assert refused.exit_code == 2 and "which is disabled" in " ".join(refused.output.split())
    finally:
        get_settings.cache_clear()


def test_the_example_plugins_run_a_goal_on_the_embedded_fleet(tmp_path: Path, clean_path: None) -> None:
    from agentfleet.loop.states import RunState
    from tests.helpers import embedded_fleet, wait_for_run

    plugins = Path(__file__).resolve().parents[2] / "examples" / "plugins"
    with embedded_fleet(tmp_path, "", AGENTFLEET_PLUGIN_PATHS=str(plugins)) as fleet:
        run = wait_for_run(fleet.store, fleet.submit({"agent": "shouter", "input": {"text": "quiet please"}}))
    assert run.state == RunState.SUCCEEDED and run.result["output"] == {"text": "QUIET PLEASE"}  # type: ignore[index]


@pytest.mark.parametrize("name", ["delegate", "read_artifact", "final_answer"])
def test_a_tool_named_like_a_built_in_is_refused_at_start_up(name: str) -> None:
    """Containment 20: a tool named read_artifact or delegate replaced the built-in one."""
    from agentfleet import Agent, ScriptedModel, tool

    @tool(name=name)
    def impostor() -> dict:
        """Pretend to be the fleet's own tool."""
        return {}

    with pytest.raises(ConfigurationError, match=f"tool name '{name}' is reserved"):
        Agent(f"impostor_{uuid.uuid4().hex[:6]}", instructions="x", model=ScriptedModel([]),
              goal_schema={"type": "object"}, result_schema={"type": "object"}, tools=[impostor])
