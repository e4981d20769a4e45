"""What the host-cache reproductions share: a safety mutant's counterexample replayed on
the engine with the bug (its state breaks the property), then on the correct engine
(refused at the spec's first forbidden step, or legal throughout), which runs on to the
end with nothing held."""

from __future__ import annotations

from refimpl.engine import Engine
from refimpl.replay import Out, Repro, Result


def host_repro(
    name: str,
    prop: str,
    mutant: str,
    doc: str,
    refused_by: str | None,
    damage: str,
    out: Out | None,
) -> tuple[Repro, Engine]:
    r = Repro(name, prop, mutant, out)
    r.say(doc)
    r.model_check()
    e = r.replay_with_bug()
    w = e.abstract()
    r.damage = damage.format(
        pins=w.hc_pin, free=e.H.alloc.num_free, cap=e.H.alloc.capacity, hl=w.hc_hl
    )
    return r, e


def prevented(r: Repro, refused_by: str | None, what: str) -> Result:
    e, _ = r.replay_without_bug(refused_by)
    waited = r.survives(e)
    r.prevented = f"{what} ({len(waited.steps)} more steps, every request ends, nothing held)"
    return r.result()
