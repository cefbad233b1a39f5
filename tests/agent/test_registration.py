"""``search_r1`` is in verl's agent-loop registry in a fresh process after ``import verl`` only."""

import os
import subprocess
import sys
import textwrap

REGISTRY = "verl.experimental.agent_loop.agent_loop"


def run_fresh(code: str, **env):
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, "RAY_AUTH_MODE": "disabled", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_registered_after_import_verl_and_config_file_entries_survive():
    out = run_fresh(
        f"""
        import sys
        import verl  # the only import: verl loads our plugin through its entry point
        assert "sorl_verl.agent.search_r1_loop" not in sys.modules  # registration stays light
        from {REGISTRY} import _agent_loop_registry as registry
        import hydra.utils
        from omegaconf import OmegaConf
        assert registry["search_r1"] == {{"_target_": "sorl_verl.agent.search_r1_loop.SearchR1AgentLoop"}}
        cls = hydra.utils.get_class(registry["search_r1"]["_target_"])
        from verl.experimental.agent_loop.agent_loop import AgentLoopBase
        assert issubclass(cls, AgentLoopBase) and cls.__name__ == "SearchR1AgentLoop"
        # verl's worker puts agent_loop_config_path entries in the registry before hydra first
        # imports our module; importing it must not overwrite them.
        del sys.modules["sorl_verl.agent.search_r1_loop"]
        entry = OmegaConf.create({{"name": "search_r1", "_target_": registry["search_r1"]["_target_"], "max_turns": 5}})
        registry["search_r1"] = entry
        import sorl_verl.agent.search_r1_loop  # noqa: F401
        assert registry["search_r1"] is entry
        print("OK")
        """
    )
    assert "OK" in out


def test_import_hook_registers_when_the_registry_module_loads_later():
    # Without verl's plugin discovery nothing imports the registry module early, so our
    # import hook (not the direct path) must add the entry when it first loads.
    out = run_fresh(
        f"""
        import sys
        import verl
        import sorl_verl.agent
        assert "{REGISTRY}" not in sys.modules
        from {REGISTRY} import _agent_loop_registry as registry
        assert registry["search_r1"]["_target_"] == sorl_verl.agent.AGENT_LOOP_TARGET
        assert "tool_agent" in registry  # verl's own entries are intact
        from sorl_verl._import_hooks import _FINDER
        assert "{REGISTRY}" not in _FINDER.pending  # one shot
        import inspect, {REGISTRY} as module
        assert "_agent_loop_registry" in inspect.getsource(module)  # the wrapped loader still serves source
        print("OK")
        """,
        VERL_USE_EXTERNAL_PLUGINS="none",
    )
    assert "OK" in out


def test_registered_when_the_loop_module_is_what_first_imports_verls_registry():
    # The loop module imports verl's registry module, whose import runs our hook: the hook must
    # not import the (half-initialised) loop module back (it did, and the entry went missing).
    out = run_fresh(
        f"""
        import sys
        import sorl_verl.agent.search_r1_loop  # first import of verl's registry happens in here
        from {REGISTRY} import _agent_loop_registry as registry
        assert registry["search_r1"] == {{"_target_": "sorl_verl.agent.search_r1_loop.SearchR1AgentLoop"}}
        print("OK")
        """
    )
    assert "OK" in out
