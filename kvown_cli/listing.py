"""``kvown list``: the one vocabulary (actions, properties, mutants, configs)."""

from __future__ import annotations

import argparse
import json

from rich.table import Table

from kvown_cli.progress import console
from spec.actions import ACTIONS
from spec.config import CONFIGS, DEFAULT_SUITE, SCALE
from spec.mutants import MUTANTS
from spec.properties import PROPERTIES

HELP = "list actions, properties, mutants and configs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")


def vocabulary() -> dict[str, object]:
    return {
        "actions": [{"name": a.name, "actor": a.actor, "kind": a.kind} for a in ACTIONS.values()],
        "properties": [{"id": p.id, "kind": p.kind, "doc": p.doc} for p in PROPERTIES.values()],
        "mutants": [{"name": m.name, "expected": m.expected} for m in MUTANTS.values()],
        "configs": [
            {"name": c.name, "doc": c.doc, "default": c.name in DEFAULT_SUITE}
            for c in (*CONFIGS.values(), *SCALE.values())
        ],
    }


def run(args: argparse.Namespace) -> int:
    v = vocabulary()
    if args.json:
        print(json.dumps(v))
        return 0
    con = console()
    for key, cols in (
        ("actions", ("name", "actor", "kind")),
        ("properties", ("id", "kind", "doc")),
        ("mutants", ("name", "expected")),
        ("configs", ("name", "default", "doc")),
    ):
        t = Table(title=key)
        for col in cols:
            t.add_column(col)
        for row in v[key]:  # type: ignore[attr-defined]
            t.add_row(*(str(row[c]) for c in cols))
        con.print(t)
    return 0
