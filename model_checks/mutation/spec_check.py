"""``python -m model_checks.mutation.spec_check --suite default``: judge the spec as it is
on disk (a mutant's copy) by the model check alone.

Exit 0: every property (state, transition and liveness) holds on every config of the
suite, so the mutant survived. ``--coverage`` adds a vacuity check: every action (and
a crash of each worker) must fire somewhere in the suite, as it does in the spec; a
mutant that silently disables one explores less, which no property can notice.
Exit 1: a property (or an INVARIANTS.md conjunct) is violated (the last line names it
and the config), the state space outgrew its bound, or the mutated spec raised. The
configs run in increasing size (``order``: pinned distinct states), each stops at its
first safety violation, and the run stops at the first config that breaks.
"""

from __future__ import annotations

import argparse
import json
import sys

import spec
from model_checks.explicit.explore import explore
from model_checks.explicit.liveness import check_liveness
from spec.actions import ACTIONS
from spec.config import SUITES, get_config

GROWTH = 4  # a mutant may explore this many times the pinned states before it counts as killed


def pinned_states(name: str) -> int | None:
    """The pinned distinct states of ``name`` (None: not pinned)."""
    from pathlib import Path

    pinned = Path(spec.__file__).resolve().parent / "pinned.json"
    try:
        data = json.loads(pinned.read_text())
        section = data["configs"] if name in data["configs"] else data["deep"]
        return int(section[name]["distinct_states"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _bound(name: str) -> int:
    """The state bound for ``name``: GROWTH x its pinned distinct states (2M if unpinned)."""
    n = pinned_states(name)
    return 2_000_000 if n is None else max(10_000, GROWTH * n)


def order(suites: list[str]) -> list[str]:
    """The configs of ``suites`` in increasing size (pinned distinct states; unpinned
    last): a mutant that breaks a small world dies in a fraction of a second."""
    names = dict.fromkeys(n for s in suites for n in SUITES[s])
    return sorted(names, key=lambda n: (pinned_states(n) or 2_000_000, n))


def judge(config: str, fired: set[str] | None = None) -> str | None:
    """The first property ``config`` breaks (None: all hold). ``fired`` collects the
    actions (crashes per worker) that fire on an edge."""
    c = get_config(config)
    try:
        g = explore(c, frozenset(), stop_on="*", max_states=_bound(config))
    except RuntimeError as exc:  # the bound: a counter or epoch no longer bounded
        return f"state space: {exc}"
    broken = sorted({*g.first_violation, *g.first_step_violation})
    if broken:
        return ",".join(broken)
    if fired is not None:
        fired.update(f"{n}({a})" if n == "EnvCrash" else n for n, _, a in set(g.lab))
    for lr in check_liveness(g):
        if not lr.holds:
            return lr.prop
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--suite", choices=sorted(SUITES), action="append")
    ap.add_argument("--coverage", action="store_true", help="every action must fire somewhere")
    args = ap.parse_args(argv)
    fired: set[str] | None = set() if args.coverage else None
    suites = args.suite or ["default"]
    for name in order(suites):
        bad = judge(name, fired)
        if bad is not None:
            print(f"killed: {bad} on {name}")
            return 1
    if fired is not None:
        want = {n for n in ACTIONS if n != "EnvCrash"} | {"EnvCrash(0)", "EnvCrash(1)"}
        idle = sorted(want - fired)
        if idle:
            print(f"killed: vacuity: never fires in {', '.join(suites)}: {', '.join(idle)}")
            return 1
    print(f"survived: every property holds on {', '.join(suites)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
