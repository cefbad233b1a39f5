"""``SearchTool`` from the example tool config, alone and inside verl's own ``tool_agent`` loop."""

import asyncio
import json
from pathlib import Path

import pytest

from sorl_verl.agent.retrieval_client import format_passages

REPO = Path(__file__).resolve().parents[2]
TOOL_CONFIG = REPO / "examples/configs/search_tool.yaml"


@pytest.fixture
def search_tool():
    """The tool exactly as verl's worker builds it from the example YAML (retriever set per test)."""
    from verl.tools.tool_registry import initialize_tools_from_config

    (tool,) = initialize_tools_from_config(str(TOOL_CONFIG))
    return tool


def execute(tool, parameters):
    async def main():
        instance_id, _ = await tool.create()
        try:
            return await tool.execute(instance_id, parameters)
        finally:
            await tool.release(instance_id)

    return asyncio.run(main())


def test_example_config_builds_the_tool_with_its_schema(search_tool):
    from sorl_verl.agent.search_tool import SearchTool

    assert isinstance(search_tool, SearchTool)
    assert search_tool.name == "search" and search_tool.topk == 3
    assert search_tool.retriever_spec == "embedded"  # nothing loaded until the first call
    schema = search_tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
    assert schema["function"]["parameters"]["required"] == ["query_list"]
    assert SearchTool({"type": "native"}).tool_schema.function.name == "search"  # default schema


def test_returns_search_r1_passages_after_a_server_error(search_tool, stub_server, fake_retriever):
    search_tool.http_options = search_tool.http_options.__class__(backoff_s=0.01, max_retries=2)
    with stub_server(fail_first=1) as stub:
        search_tool.retriever_spec = stub.url
        response, reward, metrics = execute(search_tool, {"query_list": ["capital France"]})
    assert len(stub.requests) == 2  # 500, then 200
    assert response.text == format_passages(fake_retriever.search(["capital France"], 3)[0]).strip()
    assert response.text.startswith('Doc 1(Title: "Paris") Paris is the capital')
    assert reward == 0.0 and metrics == {"num_queries": 1, "num_hits": 3, "search_error": 0}


def test_several_queries_give_one_block_each(search_tool, stub_server):
    with stub_server() as stub:
        search_tool.retriever_spec = stub.url
        response, _, metrics = execute(search_tool, {"query_list": ["Berlin", "Danube"]})
    assert response.text.startswith("Results for query 'Berlin':\nDoc 1(Title: \"Berlin\")")
    assert "\n\nResults for query 'Danube':\nDoc 1(Title: \"Danube\")" in response.text
    assert metrics["num_queries"] == 2


def test_server_down_raises_as_in_the_search_r1_loop(search_tool, stub_server):
    """One policy for retrieval failures: the tool raises, like the search_r1 loop, never a fake observation."""
    from sorl_verl.agent.retrieval_client import RetrievalError

    search_tool.http_options = search_tool.http_options.__class__(backoff_s=0.01, max_retries=1)
    with stub_server(fail_first=100) as stub:
        search_tool.retriever_spec = stub.url
        with pytest.raises(RetrievalError, match="failed after 2 attempt.*HTTP 500"):
            execute(search_tool, {"query_list": ["x"]})
    assert len(stub.requests) == 2


def test_http_options_are_one_nested_mapping_and_flat_keys_are_deprecated():
    from sorl_verl.agent.retrieval_client import HttpOptions
    from sorl_verl.agent.search_tool import SearchTool

    assert SearchTool({"type": "native", "http": {"deadline_s": 5}}).http_options == HttpOptions(deadline_s=5.0)
    with pytest.warns(DeprecationWarning, match="nest them under 'http:'"):
        tool = SearchTool({"type": "native", "timeout_s": 7, "max_retries": 1})
    assert tool.http_options == HttpOptions(timeout_s=7.0, max_retries=1)
    with pytest.raises(ValueError, match="both flat"):
        SearchTool({"type": "native", "timeout_s": 7, "http": {"max_retries": 1}})
    with pytest.raises(ValueError, match="unknown option"):
        SearchTool({"type": "native", "http": {"retries": 1}})


def test_example_configs_use_the_same_http_mapping():
    import yaml

    tool = yaml.safe_load(TOOL_CONFIG.read_text())["tools"][0]["config"]
    assert "timeout_s" not in tool and set(tool["http"]) >= {"timeout_s", "deadline_s", "max_retries"}
    loop_yaml = (REPO / "examples/configs/search_r1_agent.yaml").read_text()
    assert "# http: {timeout_s: 30, deadline_s: 60," in loop_yaml


@pytest.mark.parametrize("parameters", [{}, {"query_list": []}, {"query_list": [""]}, {"query_list": [1]}])
def test_bad_arguments_get_an_error_message(search_tool, parameters):
    response, _, metrics = execute(search_tool, parameters)
    assert response.text.startswith("Error: 'query_list' must") and metrics["search_error"] == 1


def test_runs_inside_verls_tool_agent_loop(
    search_tool, stub_server, tokenizer, scripted_server, fake_retriever, agent_loop_factory
):
    """verl's hermes parser finds the call, our tool answers, the reply is a masked tool turn."""
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    call = {"name": "search", "arguments": {"query_list": ["Seine river"]}}
    turns = [f"<tool_call>\n{json.dumps(call)}\n</tool_call>", "<answer> Paris </answer>"]
    server = scripted_server(turns)
    server.char_ids = lambda text: tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "name": "vllm",
                    "prompt_length": 1024,
                    "response_length": 1024,
                    "full_determinism": False,
                    "multi_turn": {
                        "max_user_turns": 4,
                        "max_assistant_turns": 4,
                        "max_parallel_calls": 1,
                        "max_tool_response_length": 4096,
                        "tool_response_truncate_side": "middle",
                        "format": "hermes",
                    },
                }
            },
            "data": {"apply_chat_template_kwargs": {}},
        }
    )
    with stub_server() as stub:
        search_tool.retriever_spec = stub.url

        async def main():
            loop = agent_loop_factory(_agent_loop_registry["tool_agent"], config, server, tokenizer, [search_tool])
            return await loop.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": "Which river?"}])

        output = asyncio.run(main())
    assert [r["body"]["queries"] for r in stub.requests] == [["Seine river"]]
    text = tokenizer.decode([t for t, m in zip(output.response_ids, output.response_mask, strict=True) if m == 0])
    assert format_passages(fake_retriever.search(["Seine river"], 3)[0]).strip() in text
    assert "<tool_response>" in text
    assert len(server.calls) == 2 and output.response_mask[0] == 1 and output.response_mask[-1] == 1
