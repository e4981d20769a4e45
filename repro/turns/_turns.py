"""What the four multi-turn repro scripts share (spec/behaviours/turns.py): the model
check of the mutant, its counterexample on the engine with the bug (the damage), and on
the correct engine (the refusal, which changes nothing)."""

from __future__ import annotations

from refimpl.engine.core import Engine
from refimpl.replay import Out, Repro, Result
from spec.state import REPLICA_NAMES


def turn_repro(
    name: str, prop: str, mutant: str, doc: str, out: Out | None, damage: str, prevented: str
) -> tuple[Repro, Engine]:
    """Run the shared part; returns the repro (to add checks) and the buggy engine."""
    r = Repro(name, prop, mutant, out)
    r.say(doc)
    r.model_check()
    e = r.replay_with_bug()
    t = e.turns[0]
    r.damage = damage.format(tn=t.tn, ti=t.ti, kv=len(t.kv), d=REPLICA_NAMES[e.d_status(0)])
    _, err = r.replay_without_bug(prop)
    r.prevented = prevented + (f" ({type(err).__name__}: {err})" if err is not None else "")
    return r, e


def finish(r: Repro) -> Result:
    return r.result()
