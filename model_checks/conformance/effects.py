"""Which replica each action frees or allocates, and what it writes: derived from the spec.

``blame`` judges a step the spec does not enable by its *unguarded effect*: what the
engine did anyway. That effect is not written here; it is read off the spec's own
actions, traced on symbolic state (``model_checks.symbolic.tracer``): every action in
every pinned world the z3 encoding takes (``CONFIGS``, mutants off), with every message
code of the kinds it consumes, each path that ends in a successor. Per action:

- ``frees``: the replica sides (``p``, ``h``, ``d``) that some path sets to ``NONE`` and
  every path writes (``DecodeAbort``'s quarantine writes ``d`` too; a side that a path
  keeps, as ``PrefillReloadCommit`` keeps a host copy that is not complete, is not freed);
- ``allocs``: the sides that every path of those (every path, for an action that frees
  nothing) writes to one replica state, from ``NONE`` (z3 proves each path requires it);
- ``writes``: the fields those paths all write to one constant, over the paths that move
  no global: the request's half of a step that also moves a prefix reference, a pin of
  the shared host cache or the fault budget would leave the counter behind. So
  ``PrefillTimeout`` fails a running request but not an ended one: ``st`` is not written;
  the shared host cache's actions, every path of which moves a pin, write nothing.

Tracing every world costs seconds, so the table is kept in ``effects.json`` and loaded
(``TABLE``); ``tests/conformance/test_effects_derived.py`` derives it again and fails
when the file is stale; ``python -m model_checks.conformance.effects --write`` rewrites
it. The worker actions (``symbolic.actions.WORKER``: they act on every request, not one)
have no entry (``untraced``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from spec.actions import ACTIONS
from spec.state import NONE

SIDES = ("p", "h", "d")
PATH = Path(__file__).resolve().with_name("effects.json")


class Effect(NamedTuple):
    writes: dict[str, int]  # field: the constant it is set to
    frees: tuple[str, ...]  # sides freed
    allocs: tuple[str, ...]  # sides allocated (from NONE)


# (condition, field: constant or None, writes a global, state)
Step = tuple[Any, dict[str, int | None], bool, Any]


def _const(v: Any) -> int | None:
    import z3

    if isinstance(v, bool | int):
        return int(v)
    if z3.is_bv_value(v) or z3.is_int_value(v):
        return int(v.as_long())
    return None  # a term of the state (mv + 1, g | flag): not a constant


def _paths() -> Iterator[tuple[str, Step]]:
    """(action, path) for every successor path of every traced action in every world."""
    from model_checks.symbolic.actions import GLOBAL, PER_REQ
    from model_checks.symbolic.core import Msg
    from model_checks.symbolic.encoding import Encoding
    from model_checks.symbolic.finite import FCtx
    from model_checks.symbolic.tracer.trace import trace
    from spec.config import CONFIGS
    from spec.state import msg_epoch, msg_idx, msg_kind

    for c in CONFIGS.values():
        # a log cannot declare layers (spec/EVENTLOG.md): the streamed worlds' paths (a
        # Nack to a freed source fails the request, stream_resume) are no log's effects
        if c.layers:
            continue
        enc = Encoding(c, instances=False)
        s = enc.state("fx")
        x, view = FCtx(enc, s), enc.view(s, 0)
        for name in (*PER_REQ, *GLOBAL):
            a = ACTIONS[name]
            args: list[Msg | None] = [None]
            if a.arg == "msg":
                codes = (k for k in enc.codes if msg_kind(k) in a.msgs)
                args = [Msg(msg_kind(k), msg_epoch(k), msg_idx(k)) for k in codes]
            for m in args:
                rules = trace(name, x, view if a.arg != "global" else None, m)
                for b in rules.branches:
                    if b.go is not None and b.cond is not False:
                        req = {f: _const(v) for f, v in b.go.req.items()}
                        yield name, (b.cond, req, bool(b.go.glob), s)


def _from_none(paths: list[Step], side: str) -> bool:
    import z3

    for cond, _, _, s in paths:
        sol = z3.Solver()
        sol.add(cond, s[("r", 0, side)] != NONE)
        if sol.check() != z3.unsat:
            return False
    return True


def effect_of(paths: list[Step]) -> Effect:
    """The unguarded effect of an action with these successor paths (the rule above)."""
    ws = [w for _, w, _, _ in paths]
    frees = tuple(s for s in SIDES if any(w.get(s) == NONE for w in ws) and all(s in w for w in ws))
    chosen = [p for p in paths if any(p[1].get(s) == NONE for s in frees)] or paths
    allocs = tuple(
        s for s in SIDES if _common(chosen).get(s, NONE) != NONE and _from_none(chosen, s)
    )
    own = [p for p in chosen if not p[2]]  # judged on the request alone: no global moved
    return Effect(_common(own), frees, allocs)


def _common(paths: list[Step]) -> dict[str, int]:
    """The fields every path writes, each to the same constant."""
    if not paths:
        return {}
    ws = [w for _, w, _, _ in paths]
    return {f: v for f, v in ws[0].items() if v is not None and all(w.get(f) == v for w in ws)}


def derive() -> dict[str, Effect]:
    """Every traced action's effect (an action with no successor path in any world: none)."""
    from model_checks.symbolic.actions import GLOBAL, PER_REQ

    by: dict[str, list[Step]] = {n: [] for n in (*PER_REQ, *GLOBAL)}
    for name, p in _paths():
        by[name].append(p)
    return {n: effect_of(ps) for n, ps in by.items()}


def untraced() -> tuple[str, ...]:
    """The actions the tracer leaves out, which therefore have no derived effect."""
    from model_checks.symbolic.actions import WORKER

    return WORKER


def dumps(table: dict[str, Effect]) -> str:
    """The file's text: a note, then one action a line."""
    rows = (
        f"  {json.dumps(n)}: "
        + json.dumps({"writes": e.writes, "frees": e.frees, "allocs": e.allocs}, sort_keys=True)
        for n, e in sorted(table.items())
    )
    note = "derived from the spec's traced actions: python -m model_checks.conformance.effects"
    return f'{{"note": "{note} --write",\n "actions": {{\n' + ",\n".join(rows) + "\n }\n}\n"


def load(path: Path = PATH) -> dict[str, Effect]:
    raw = json.loads(path.read_text())["actions"]
    return {
        n: Effect(dict(e["writes"]), tuple(e["frees"]), tuple(e["allocs"])) for n, e in raw.items()
    }


TABLE: dict[str, Effect] = load()


def main() -> int:
    ap = argparse.ArgumentParser(description="derive the checker's effect table from the spec")
    ap.add_argument("--write", action="store_true", help=f"rewrite {PATH.name}")
    args = ap.parse_args()
    now = derive()
    if args.write:
        PATH.write_text(dumps(now))
        print(f"wrote {PATH}")
        return 0
    stale = sorted(n for n in set(now) | set(TABLE) if now.get(n) != TABLE.get(n))
    print("up to date" if not stale else f"stale: {', '.join(stale)}")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
