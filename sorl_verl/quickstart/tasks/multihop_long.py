"""Multi-hop QA, the long variant: four or five chained lookups (5-6 model turns).

The multi-hop task's chains (:mod:`.multihop`) taken two hops further, through a town's mayor and a
person's spouse: "Who is the spouse of the mayor of the birthplace of the founder of the capital of
Tavo Kemu?". Everything else is the multi-hop task's: the made-up knowledge base, the disjoint
splits, the demonstrations and the decision RL has to unlearn (answering right after the first hop,
in a share ``early_answer_fraction`` of the demonstrated choices). Ours, for the segment study
(docs/segments.md): its episodes are long enough for a pool of episodes started together to stay in
phase for several steps, which the 3-4 turns of the multi-hop task are not.
"""

from __future__ import annotations

from dataclasses import dataclass

from sorl_verl.quickstart.tasks import SEARCH_LOOP_OPTIONS, QuickstartTask, multihop
from sorl_verl.quickstart.tasks import _search_loop as loop

HOPS = (4, 5)
SPEC = multihop._Spec(HOPS)


@dataclass
class MultihopLongConfig(multihop.MultihopConfig):
    """Settings of the long multi-hop task's steps 1-2 (recorded in ``prepare.json``)."""

    task: str = "multihop_long"


def prepare(run_dir, cfg: MultihopLongConfig | None = None, show_progress: bool = True) -> dict:
    return loop.prepare_search_loop(SPEC, run_dir, cfg or MultihopLongConfig(), show_progress)


TASK = QuickstartTask(
    name="multihop_long",
    summary="multi-hop QA, long: four or five chained lookups of made-up facts (5-6 model turns)",
    config=MultihopLongConfig,
    prepare=prepare,
    report=multihop.report,
    demo_mix=SPEC.demo_mix_field,
    options=SEARCH_LOOP_OPTIONS,
    # the multi-hop task's, with room for two more hops (a search and an observation each)
    defaults={**multihop.TASK.defaults, "MAX_TURNS": "6", "MAX_RESPONSE_LENGTH": "416"},
    episode_turns=sum(hops + 1 for hops in HOPS) / len(HOPS),
)
