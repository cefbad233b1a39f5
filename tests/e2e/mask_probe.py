"""Test-only agent loop: the ``search_r1`` loop plus a record of what the server generated.

Imported by verl's agent-loop workers (``PYTHONPATH`` includes this folder in the e2e runs).
For every trajectory it appends one JSON line to ``$SORL_E2E_PROBE_PATH``: the loop's
``prompt_ids``, ``response_ids``, ``response_mask`` and, for each ``generate`` call the loop
made, the prompt it sent and the tokens the server returned. The e2e test rebuilds from the
calls which response positions the model produced and compares that with the mask.
"""

import json
import os

from sorl_verl.agent.search_r1_loop import SearchR1AgentLoop


class _RecordingServer:
    def __init__(self, server, calls):
        self._server, self._calls = server, calls

    async def generate(self, *args, **kwargs):
        output = await self._server.generate(*args, **kwargs)
        fields = output.extra_fields or {}
        self._calls.append(
            {
                "prompt_ids": list(kwargs["prompt_ids"]),
                "token_ids": list(output.token_ids),
                # weight versions [oldest, newest] that generated this call (async trainers)
                "versions": [fields.get("min_global_steps"), fields.get("max_global_steps")],
            }
        )
        return output

    def __getattr__(self, name):
        return getattr(self._server, name)


class MaskProbeAgentLoop(SearchR1AgentLoop):
    async def run(self, sampling_params, **kwargs):
        calls = []
        self.server_manager = _RecordingServer(self.server_manager, calls)
        output = await super().run(sampling_params, **kwargs)
        record = {
            "uid": str(kwargs.get("uid")),
            "session_id": int(kwargs.get("session_id", -1)),
            "prompt_ids": list(output.prompt_ids),
            "response_ids": list(output.response_ids),
            "response_mask": list(output.response_mask),
            "calls": calls,
        }
        with open(os.environ["SORL_E2E_PROBE_PATH"], "a", encoding="utf-8") as sink:
            sink.write(json.dumps(record) + "\n")
        return output
