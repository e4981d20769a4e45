"""A streamed offer that reads its source blocks when it sends, not at ``send_layer``.

One request streamed layer by layer (``Config.layers``). ``send_layer`` must copy the
layer's bytes at once: the offer's contract lets the engine free (and another request
reuse) the source blocks once every layer was given. With the bug the sender takes no
copy, the engine frees the blocks after the last ``send_layer``, and the bytes still to
send are read from blocks another request may now own (NoReuseUnderIO): another
request's KV sealed as this one's (issue #30 bug 2).

The correct sender copies each layer at ``send_layer``: every step of the same run is
legal, and the freed source holds no byte still to send.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.replay import Out, Repro, Result  # noqa: E402
from repro._script import script_main  # noqa: E402

PROPERTY = "NoReuseUnderIO"
MUTANT = "stream_reads_at_ready"
COVERS = ("issue #30 bug 2: a streamed offer reads its source at the receiver's Ready",)
SCENARIO = "send_layer takes no copy; the source is freed with layers still to send"


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    c, _ = r.model_check()
    e = r.replay_with_bug()
    bad = [i for i, q in enumerate(e.abstract().reqs) if q.fs and q.cpy < c.layers]
    r.expect(bool(bad), f"a freed source with layers not copied: r{bad}")
    r.damage = (
        f"r{bad[0] if bad else '?'} gave its source blocks back while layers of it were still"
        " to be read from them: what leaves is whatever the blocks hold when it is sent"
    )
    e2, _ = r.replay_without_bug(None)
    copied = all(q.cpy >= c.layers for q in e2.abstract().reqs if q.fs)
    r.expect(copied, "the correct sender copied every layer before the source was freed")
    r.prevented = "each layer was copied at send_layer: the freed blocks hold nothing to send"
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
