"""A sound shortcut for spec mutants: does the mutant change any step of the suite?

The mutated action module is loaded beside the real one (never installed), and every
action that can reach the edited function (by name, within the module) is run on every
reachable state of the correct suite, with every argument the explorer would try. If
the mutant returns the same successor as the spec everywhere, then from the initial
state on it explores the very same graph, so every check gives the same verdict: it
survives, and no model check needs to run. (A refusal that names another property is
no difference: the explorer draws no edge for either.)

Mutants of ``spec/common.py`` are never short-cut: the property predicates read its
helpers too.
"""

from __future__ import annotations

import ast
import types
from collections.abc import Iterable
from pathlib import Path

from model_checks.explicit.explore import explore
from model_checks.mutation.operators import Mutant
from spec.actions import ACTIONS, ActionFn
from spec.config import Config, get_config
from spec.state import World, msg_kind

ROOT = Path(__file__).resolve().parents[2]
ACTION_FILES = {
    "spec/actions_prefill.py": "spec.actions_prefill",
    "spec/actions_decode.py": "spec.actions_decode",
    "spec/actions_env.py": "spec.actions_env",
}


class Reachable:
    """The reachable states of each config of a suite (explored once, correct spec)."""

    def __init__(self, configs: Iterable[str]) -> None:
        self.states: dict[str, tuple[Config, list[World]]] = {}
        for name in configs:
            c = get_config(name)
            self.states[name] = (c, explore(c).states)


def _affected(source: str, qualname: str) -> set[str]:
    """The module's functions that can reach ``qualname`` (all of them for an edit
    outside any function)."""
    tree = ast.parse(source)
    refs: dict[str, set[str]] = {}
    for n in tree.body:
        if isinstance(n, ast.FunctionDef):
            refs[n.name] = {x.id for x in ast.walk(n) if isinstance(x, ast.Name)}
    top = qualname.split(".")[0]
    if top not in refs:
        return set(refs)
    out = {top}
    grew = True
    while grew:
        grew = False
        for f, names in refs.items():
            if f not in out and names & out:
                out.add(f)
                grew = True
    return out


def _load(m: Mutant, module: str) -> types.ModuleType:
    mod = types.ModuleType(module + "__mutant")
    mod.__file__ = m.file
    exec(compile(m.source, m.file, "exec"), mod.__dict__)  # noqa: S102 - generated source of our own spec
    return mod


def _args(w: World, c: Config, kind: str, msgs: frozenset[int]) -> Iterable[tuple[int, int]]:
    if kind == "req":
        return ((i, 0) for i in range(len(w.reqs)))
    if kind == "msg":
        return (
            (i, code)
            for i, r in enumerate(w.reqs)
            for code in sorted(set(r.net))
            if msg_kind(code) in msgs
        )
    if kind == "global":
        return ((0, 0),)
    return ((0, 0), (0, 1)) if "crash" in c.fault_kinds else ()


def changes_a_step(m: Mutant, reach: Reachable) -> bool | None:
    """True: some reachable step differs; False: none does; None: cannot tell here."""
    module = ACTION_FILES.get(m.file)
    if module is None:
        return None
    original_source = (ROOT / m.file).read_text(encoding="utf-8")
    scope = m.id.split(":", 1)[0].removeprefix(module).lstrip(".")
    names = _affected(original_source, scope)
    try:
        mod = _load(m, module)
    except Exception:  # noqa: BLE001 - a mutant that does not even load differs
        return True
    pairs: list[tuple[ActionFn, ActionFn, str, frozenset[int]]] = []
    for name in sorted(names):
        a = ACTIONS.get(name)
        if a is not None and a.fn.__module__ == module:
            pairs.append((a.fn, getattr(mod, name), a.arg, a.msgs))
    none: frozenset[str] = frozenset()
    for c, states in reach.states.values():
        for fn, mut, kind, msgs in pairs:
            for w in states:
                for i, arg in _args(w, c, kind, msgs):
                    o = fn(w, c, none, i, arg)
                    try:
                        u = mut(w, c, none, i, arg)
                    except Exception:  # noqa: BLE001 - it raises where the spec does not
                        return True
                    if (type(o) is World or type(u) is World) and o != u:
                        return True
    return False
