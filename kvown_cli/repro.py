"""``kvown repro``: run the failure-case reproduction scripts of ``repro/``.

    kvown repro --list                 name, property, one-line scenario of each script
    kvown repro NAME [NAME ...]        run some, narrated (exit 0 when all as documented)
    kvown repro --all [--json]         run every script; --json: {"repros": [...]}

Each script is imported from its file and its ``run(out)`` returns a result record
``{name, property, damage, prevented, ok}``; nothing is shelled out. A script that does
not apply on this machine (it says ``n/a ...`` as its damage and its prevention, e.g. a
CUDA-stream failure on CPU) is reported as skipped (``"skipped": REASON``), not as ok.

Exit codes: 0 every reproduction that ran behaved as documented, 1 some did not, 2
misuse (unknown name, no name).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from kvown_cli.progress import Progress
from kvown_cli.usage import refuse
from spec.strict_json import short

HELP = "run the failure-case reproduction scripts"
REPRO_DIR = Path(__file__).resolve().parents[1] / "repro"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="*", metavar="NAME", help="scripts to run (see --list)")
    p.add_argument("--all", action="store_true", help="run every script")
    p.add_argument("--list", action="store_true", help="list the scripts and exit")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _scripts() -> dict[str, Path]:
    """Every script under ``repro/`` (grouped in subfolders: safety, liveness, datapath)."""
    return {f.stem: f for f in REPRO_DIR.glob("*/*.py") if not f.name.startswith("_")}


def script_names() -> list[str]:
    return sorted(_scripts())


def load(name: str) -> ModuleType:
    """Import ``repro/<name>.py`` from its file (the scripts are not a package)."""
    root = str(REPRO_DIR.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    key = f"kvown_repro_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, _scripts()[name])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


def describe(name: str) -> dict[str, Any]:
    m = load(name)
    return {
        "name": name,
        "property": m.PROPERTY,
        "mutant": m.MUTANT,
        "covers": list(m.COVERS),
        "scenario": m.SCENARIO,
    }


def run_one(name: str, narrate: bool) -> dict[str, object]:
    m = load(name)
    from refimpl.replay import guarded

    res = guarded(name, m.PROPERTY, m.run, print if narrate else None)
    rec = res.record()
    if res.skipped():
        rec["skipped"] = res.damage  # e.g. "n/a on CPU": it did not run here
    return rec


def _list(as_json: bool) -> int:
    rows = [describe(n) for n in script_names()]
    if as_json:
        print(json.dumps({"repros": rows}))
        return 0
    w = max(len(r["name"]) for r in rows)
    pw = max(len(r["property"]) for r in rows)
    for r in rows:
        print(f"{r['name']:{w}s}  {r['property']:{pw}s}  {r['scenario']}")
    return 0


def run(args: argparse.Namespace) -> int:
    valid = script_names()
    unknown = [n for n in args.names if n not in valid]
    if unknown:
        msg = f"unknown script {short(unknown[0])}; valid names: {', '.join(valid)}"
        return refuse("repro", msg, args.json)
    if args.list:
        return _list(args.json)
    if args.all == bool(args.names):
        return refuse("repro", "give NAME(s) or --all (or --list)", args.json)
    names = valid if args.all else list(args.names)
    narrate = not args.json and not args.all
    t0 = time.perf_counter()
    records: list[dict[str, object]] = []
    with Progress("repro", len(names), "scripts") as bar:
        if len(names) > 1:  # the model checks of all of them at once, in worker processes
            bar.update(note=f"importing {len(names)} scripts")
            mods = [load(n) for n in names]
            from refimpl.replay import prefetch

            todo = [m.MUTANT for m in mods if m.MUTANT]
            bar.update(note=f"the model checks of {len(todo)} mutants, in worker processes")
            prefetch(todo)
            bar.start_work()  # the rate of the scripts, not of the prefetch
        for n in names:
            bar.update(note=f"running {n}")
            rec = run_one(n, narrate)
            records.append(rec)
            bar.skip() if "skipped" in rec else bar.advance()  # a skip is no rate
            if not args.json and args.all:
                mark = "skip" if "skipped" in rec else "ok  " if rec["ok"] else "FAIL"
                print(f"{mark} {n}: {rec['property']}\n     damage:    {rec['damage']}")
                print(f"     prevented: {rec['prevented']}")
    bad = [r["name"] for r in records if not r["ok"]]
    skipped = [r["name"] for r in records if "skipped" in r]
    if args.json:
        print(json.dumps({"repros": records}))
    elif args.all or len(names) > 1 or skipped:  # one script's narration ends in its verdict
        # a skipped script did not run: it is not counted as behaving as documented
        took = time.perf_counter() - t0
        ran = len(records) - len(skipped)
        print(f"{ran - len(bad)} of {ran} that ran behave as documented ({took:.1f} s)")
        if skipped:
            why = "; ".join(f"{r['name']}: {r['skipped']}" for r in records if "skipped" in r)
            print(f"skipped, not run (not applicable here): {len(skipped)}: {why}")
        if bad:
            print(f"not as documented: {', '.join(map(str, bad))}")
    return 1 if bad else 0
