"""``kvown replay FILE [FILE ...]``: replay saved counterexamples on the spec, step by step.

The file is what ``kvown check --cex-dir DIR`` writes (``DIR/<config>[.<mutant>].<property>
.json``), also ``kvown check --json``'s and ``kvown prove --mutant M --json``'s object:

    {"config": NAME, "mutants": [NAME, ...] (or "mutant": NAME), "violated": PROPERTY,
     "trace": [{"action": NAME, "args": {...}}, ...]}

Each step is applied to the spec of ``config`` with the file's mutants switched on (the
bug that made the trace); after each one, every safety property is checked on the state
and every transition predicate on the step. The first step that breaks one is reported,
with every property it breaks (``violated``: the file's own one when it is among them).
``--without-mutants`` replays on the correct spec instead. ``--engine`` also replays the
steps on the torch reference engine (``refimpl``, real KV tensors, the same mutants as bug
switches) and reports whether it follows the spec step by step, which properties its
end state breaks and which replicas' bytes differ from the truth (``engine`` in the JSON).

Exit codes: 1 the violation is reproduced (a property broken on replay; for a liveness
property, the trace replays to the state the state-graph check flagged); 0 it is not
(every step replays and every property holds, or the spec refuses a step: the bug is
fixed); 2 a bad file (not JSON, not this format, an unknown config, mutant or action).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvown_cli.usage import UsageError, one_line, refuse
from spec.strict_json import StrictJSONError, loads_strict, short

HELP = "replay a saved counterexample (kvown check --cex-dir) on the spec, step by step"
MAX_BYTES = 16 << 20  # a counterexample is a few KB; a bigger file is not one (issue #34:
# the strict reader holds about 4 copies of a bracket bomb at once, so 64 MiB went past 256 MB)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "file",
        nargs="+",
        metavar="FILE",
        help="the counterexample JSON (kvown check --cex-dir DIR writes them); several: each"
        " in turn (kvown replay cex/*.json), exit 1 when any is reproduced",
    )
    p.add_argument(
        "--without-mutants",
        action="store_true",
        help="replay on the correct spec (shows the guard that refuses the bug's step)",
    )
    p.add_argument(
        "--engine",
        action="store_true",
        help="also replay it on the torch reference engine (real KV tensors, same mutants)",
    )
    p.add_argument("--json", action="store_true", help="print the verdict as one JSON object")


def load(path: str) -> dict[str, Any]:
    """The counterexample in ``path``, checked for shape; UsageError names what is wrong."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"{short(path)}: cannot read: {exc.strerror or exc}") from None
    return parse(raw, path)


def parse(raw: bytes, path: str) -> dict[str, Any]:
    """A counterexample's bytes (read from ``path``), checked for shape; UsageError names
    what is wrong."""
    try:
        doc = loads_strict(
            raw, max_bytes=MAX_BYTES, max_depth=32, max_int_digits=32, what="counterexample"
        )
    except StrictJSONError as exc:
        raise UsageError(f"{short(path)}: {exc}") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{short(path)}: expected a JSON object with config and trace")
    missing = [k for k in ("config", "trace") if k not in doc]
    if missing:
        raise UsageError(f"{short(path)}: not a counterexample: no {', '.join(missing)}")
    if not isinstance(doc["config"], str) or not isinstance(doc["trace"], list):
        raise UsageError(f"{short(path)}: 'config' must be a string and 'trace' a list")
    for k, st in enumerate(doc["trace"], start=1):
        if not isinstance(st, dict) or not isinstance(st.get("action"), str):
            raise UsageError(f"{short(path)}: trace step {k} is not an object with an 'action'")
        if not isinstance(st.get("args", {}), dict):
            raise UsageError(f"{short(path)}: trace step {k}: 'args' must be an object")
    if doc.get("violated") is not None and not isinstance(doc["violated"], str):
        raise UsageError(f"{short(path)}: 'violated' must be a property name (a string)")
    mutants = doc.get("mutants", [])
    if doc.get("mutant") is not None and not isinstance(doc["mutant"], str):
        raise UsageError(f"{short(path)}: 'mutant' must be a name (a string)")
    if doc.get("mutant"):
        mutants = [*mutants, *doc["mutant"].split(",")]
    if not isinstance(mutants, list) or not all(isinstance(m, str) for m in mutants):
        raise UsageError(f"{short(path)}: 'mutants' must be a list of names")
    return {**doc, "mutants": mutants}


def cex_hint(path: str, data: bytes | None) -> str:
    """For ``check-trace`` given a counterexample (``data``: the bytes it read of ``path``,
    None when it did not keep them all): ``; ... use kvown replay``, else ``""``. It never
    reads ``path`` again (a FIFO's writer is gone, a pipe would wait)."""
    if data is None:
        return ""
    try:
        parse(data, path)
    except UsageError:
        return ""
    return f"; this is a saved counterexample: `kvown replay {path}` replays it"


def replay_cex(doc: dict[str, Any], with_mutants: bool = True) -> dict[str, Any]:
    """The verdict: ``reproduced``, ``violated``, ``step`` (1-based), ``action``, ``why``."""
    from model_checks.explicit.trace import TraceError, replay
    from spec.actions import decode_args
    from spec.config import get_config
    from spec.mutants import get_mutant
    from spec.properties import LIVENESS, violated_safety
    from spec.steps import check_step

    try:
        c = get_config(doc["config"])
        for m in doc["mutants"]:
            get_mutant(m)
    except KeyError as exc:
        raise UsageError(str(exc.args[0])) from None
    mutants = frozenset(doc["mutants"]) if with_mutants else frozenset()
    steps: list[dict[str, Any]] = doc["trace"]
    out: dict[str, Any] = {
        "config": c.name,
        "mutants": sorted(mutants),
        "expected": doc.get("violated"),
        "steps": len(steps),
    }
    try:
        worlds = replay(c, mutants, steps)
    except TraceError as exc:
        if exc.prop is None and "refused" not in exc.detail and "not enabled" not in exc.detail:
            raise UsageError(f"step {exc.index + 1}: {exc.detail}") from None
        return {**out, "reproduced": False, "violated": None, "step": exc.index + 1,
                "action": exc.step.get("action"), "refused_by": exc.prop,
                "why": f"the spec refuses step {exc.index + 1}: {exc.detail}"}  # fmt: skip
    for k, (st, pre, post) in enumerate(zip(steps, worlds, worlds[1:], strict=False), start=1):
        i, arg = decode_args(st["action"], st.get("args", {}))
        broken = check_step(pre, st["action"], i, arg, post, c) + violated_safety(post, c)
        if broken:
            broken = list(dict.fromkeys(broken))
            first = out["expected"] if out["expected"] in broken else broken[0]
            why = f"step {k} {st['action']} breaks {', '.join(broken)}"
            return {**out, "reproduced": True, "violated": first, "violated_all": broken,
                    "step": k, "action": st["action"], "why": why}  # fmt: skip
    if doc.get("violated") in {p.id for p in LIVENESS} and mutants:
        why = (f"every step replays; the end state is where the state-graph check flags"
               f" {doc['violated']} (liveness: judged on the graph by `kvown check`)")  # fmt: skip
        return {**out, "reproduced": True, "violated": doc["violated"], "step": len(steps),
                "action": steps[-1]["action"] if steps else None, "why": why}  # fmt: skip
    why = f"all {len(steps)} steps replay and every safety property holds on each"
    return {**out, "reproduced": False, "violated": None, "step": None, "action": None, "why": why}


def on_engine(doc: dict[str, Any], verdict: dict[str, Any]) -> dict[str, Any]:
    """The replayed steps (up to the verdict's step) on the torch engine, step by step."""
    from model_checks.explicit.trace import replay
    from refimpl.engine import Engine
    from refimpl.errors import OwnershipError
    from spec.config import get_config
    from spec.properties import violated_safety

    c, m = get_config(verdict["config"]), frozenset(verdict["mutants"])
    steps = doc["trace"][: verdict["step"] or len(doc["trace"])]
    if not verdict["reproduced"] and verdict.get("action") is not None:
        steps = steps[: verdict["step"] - 1]  # the spec refused the last one
    worlds, e = replay(c, m, steps), Engine(c, mutants=m)
    out: dict[str, Any] = {"steps": len(steps), "follows_spec": True, "refused": None}
    for k, st in enumerate(steps):
        try:
            e.step(st["action"], st.get("args", {}))
        except OwnershipError as exc:
            out.update(follows_spec=False, refused=f"step {k + 1}: {type(exc).__name__}: {exc}")
            break
        if e.abstract() != worlds[k + 1]:
            out.update(follows_spec=False, refused=f"step {k + 1}: the engine's state differs")
            break
    out.update(violated=violated_safety(e.abstract(), c), damaged=e.damaged())
    return out


def run(args: argparse.Namespace) -> int:
    """One file: its verdict. Several: every file is read and checked first (a bad one is
    refused before any replay), then each is replayed; JSON ``{"replays": [...]}``."""
    paths = list(args.file)
    try:
        docs = [load(p) for p in paths]
        verdicts = [replay_cex(d, with_mutants=not args.without_mutants) for d in docs]
    except UsageError as exc:
        return refuse("replay", str(exc), args.json)
    if len(paths) == 1:
        return _show(args, docs[0], verdicts[0])
    if args.json:
        for d, v in zip(docs, verdicts, strict=True):
            if args.engine:
                v["engine"] = on_engine(d, v)
        print(
            json.dumps(
                {"replays": [{"file": p, **v} for p, v in zip(paths, verdicts, strict=True)]}
            )
        )
        return 1 if any(v["reproduced"] for v in verdicts) else 0
    rcs = []
    for p, d, v in zip(paths, docs, verdicts, strict=True):
        print(f"== {p}")
        rcs.append(_show(args, d, v))
    return max(rcs)


def _show(args: argparse.Namespace, doc: dict[str, Any], verdict: dict[str, Any]) -> int:
    if args.engine:
        verdict["engine"] = on_engine(doc, verdict)
    if args.json:
        print(json.dumps(verdict))
        return 1 if verdict["reproduced"] else 0
    from model_checks.explicit.trace import pretty
    from spec.config import get_config

    head = "REPRODUCED" if verdict["reproduced"] else "NOT REPRODUCED"
    mut = f", mutants {', '.join(verdict['mutants'])}" if verdict["mutants"] else ""
    print(f"{head}: config {verdict['config']}{mut}, {verdict['steps']} steps")
    print(f"  {one_line(verdict['why'])}")
    if verdict["expected"] and verdict["reproduced"] and verdict["violated"] != verdict["expected"]:
        print(f"  (the file expected {verdict['expected']})")
    end = verdict["step"] if verdict["reproduced"] else None
    if end is not None or verdict.get("refused_by") is None and verdict["step"] is None:
        shown = doc["trace"][:end] if end is not None else doc["trace"]
        c = get_config(verdict["config"])
        text = pretty(c, frozenset(verdict["mutants"]), shown, verdict["violated"])
        print(text)
    if args.engine:
        eng = verdict["engine"]
        follows = "follows the spec" if eng["follows_spec"] else f"departs: {eng['refused']}"
        print(f"on the torch engine: {eng['steps']} steps, {follows}; end state breaks"
              f" {', '.join(eng['violated']) or 'nothing'}; bytes off the truth:"
              f" {', '.join(eng['damaged']) or 'none'}")  # fmt: skip
    return 1 if verdict["reproduced"] else 0
