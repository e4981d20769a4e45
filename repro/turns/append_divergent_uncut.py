"""The client re-sends the history of a conversation with the assistant's reply
re-tokenised: turn 2's prompt shares only a prefix of the token ids whose KV decode
holds. Decode appends the new tokens after its whole KV, the divergent tail kept, and
turn 2 decodes on another history (ContentIdentity). On real tensors (refimpl/demo/
turns.py) the logits of turn 2 differ from the unbroken run.

The correct decode cuts the tail past the longest common token-id prefix first and
appends from there: the logits are bit-exact.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Result  # noqa: E402
from repro._script import script_main  # noqa: E402
from repro.turns._turns import finish, turn_repro  # noqa: E402

PROPERTY = "ContentIdentity"
MUTANT = "append_divergent_uncut"
COVERS = ("issue 22 item 5: an append from a prefix that no longer matches the tokens",)
SCENARIO = "turn 2's prompt diverges from decode's token ids; decode appends after its whole KV"


def run(out: Out | None = print) -> Result:
    r, e = turn_repro(
        Path(__file__).stem,
        PROPERTY,
        MUTANT,
        __doc__ or "",
        out,
        "decode appends onto {kv} token ids that include a tail the prompt does not share",
        "the append is refused until the tail is cut",
    )
    from refimpl.demo.turns import run_turns

    bad = run_turns(True, steps=2, mutants=frozenset({MUTANT}))
    good = run_turns(True, steps=2)
    r.expect(not bad.logits_equal, "on real tensors, turn 2's logits differ without the cut")
    r.expect(good.logits_equal, "with the cut, every logit equals the unbroken run")
    r.damage += f"; on the tiny model: {bad.note}, logits differ"
    r.prevented += f"; on the tiny model: {good.note}, logits bit-exact"
    return finish(r)


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
