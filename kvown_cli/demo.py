"""``kvown demo``: the data path on a real attention model, for a newcomer's first look.

Runs every handoff path of refimpl/demo/paths.py (prefill on one TP mesh, hand the KV over
the transport, decode on another), then two turns of one conversation with the second
appended on the decode worker (refimpl/demo/turns.py, PPD), and prints, per path, the
blocks and bytes that moved, the checksums verified and max |Δlogits| against decoding
with no handoff.  Exit 1 if any path's logits differ (the disk path: device -> a
published safetensors file -> device).  Then swap or recompute, per tier: host and disk
round trips and the model's prefill are timed here, and
``costmodel.swap_or_recompute_per_tier`` says, for a few request lengths, which wins and
why (``--no-tiers`` skips it).  ``--mismatch`` runs the wrong-RoPE / wrong-adapter
scenario instead (refimpl/demo/mismatch.py): exit 1 unless the mismatch visibly changes
the logits with the check off and is refused, with nothing installed, with the check on.
"""

from __future__ import annotations

import argparse
import json

from rich.table import Table

from kvown_cli.progress import console
from kvown_cli.usage import MAX_SEED, MAX_STEPS, int_in, refuse

HELP = "the data path on a real attention model: handoff paths and their logits"
JSON_KEYS = ("name", "blocks_moved", "bytes_moved", "logits_equal", "max_abs_diff")
VISIBLE = 1e-3  # a mismatch must move some logit by more than this


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--mismatch", action="store_true", help="run the manifest-mismatch scenario")
    p.add_argument(
        "--no-tiers", action="store_true", help="skip timing the tiers (swap or recompute)"
    )
    p.add_argument("--seed", type=int_in(0, MAX_SEED), default=0, help="weights and prompt seed")
    p.add_argument(
        "--steps",
        type=int_in(1, MAX_STEPS),
        default=6,
        help=f"tokens decoded after the handoff (1..{MAX_STEPS})",
    )


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.steps <= MAX_STEPS:
        return refuse("demo", f"--steps must be in [1, {MAX_STEPS}], got {args.steps}", args.json)
    if not 0 <= args.seed <= MAX_SEED:
        return refuse("demo", f"--seed must be in [0, {MAX_SEED}], got {args.seed}", args.json)
    if args.mismatch:
        return _mismatch(args)
    from refimpl.demo import run_all
    from refimpl.demo.turns import turn_paths

    records = run_all(seed=args.seed, steps=args.steps)
    records += turn_paths(seed=args.seed, steps=args.steps)  # two turns, the 2nd on decode
    ok = all(r.logits_equal for r in records)
    tiers = [] if args.no_tiers else _tier_choices(args.seed)
    if args.json:
        out: dict[str, object] = {
            "paths": [{k: r.as_dict()[k] for k in JSON_KEYS} for r in records]
        }
        if tiers:
            out["swap_or_recompute"] = tiers
        print(json.dumps(out))
        return 0 if ok else 1
    t = Table(title=f"handoff paths: decode {args.steps} tokens, compare with no handoff")
    for col in ("path", "blocks moved", "bytes moved", "checksums verified", "max |Δlogits|"):
        t.add_column(col, justify="left" if col == "path" else "right", no_wrap=col == "path")
    t.add_column("conversions / notes")
    for r in records:
        diff = f"{r.max_abs_diff:.3g}" + ("" if r.logits_equal else "  DIFFERS")
        row = (r.name, str(r.blocks_moved), str(r.bytes_moved), str(r.checksums_verified))
        t.add_row(*row, diff, r.note, style=None if r.logits_equal else "red")
    con = console()
    con.print(t)
    con.print("every path bit-exact (torch.equal)" if ok else "[red]some path differs[/red]")
    if tiers:
        con.print(_tier_table(tiers))
    return 0 if ok else 1


def _tier_choices(seed: int) -> list[dict[str, object]]:
    """Swap or recompute per tier, for the demo model at a few lengths, rates measured."""
    import tempfile
    from pathlib import Path

    from refimpl.demo import DEMO_CONFIG, choices, measure_prefill, measure_tiers

    with tempfile.TemporaryDirectory(prefix="kvown-demo-tiers-") as d:
        tiers = measure_tiers(Path(d))
    rate = measure_prefill(DEMO_CONFIG, seed=seed)
    rates = {t.name: (t.out_bytes_per_s, t.in_bytes_per_s, t.fixed_s) for t in tiers}
    out: list[dict[str, object]] = []
    for c in choices(DEMO_CONFIG, tiers, rate):
        row: dict[str, object] = {
            "tokens": c.tokens,
            "kv_bytes": c.kv_bytes,
            "choice": c.choice,
            "recompute_s": c.recompute_s,
            "swap_s": c.swap_s,
            "reason": c.reason,
            "prefill_tokens_per_s": rate,
            "tiers": rates,
        }
        out.append(row)
    return out


def _tier_table(rows: list[dict[str, object]]) -> Table:
    t = Table(title="swap or recompute, per tier (rates measured on this machine)")
    for col in ("tokens", "M_KV bytes", "choice", "reason"):
        t.add_column(col, justify="right" if col != "reason" else "left")
    for r in rows:
        t.add_row(str(r["tokens"]), str(r["kv_bytes"]), str(r["choice"]), str(r["reason"]))
    return t


def _mismatch(args: argparse.Namespace) -> int:
    from refimpl.demo.mismatch import SWITCH, run_all

    records = run_all(seed=args.seed, steps=args.steps)
    ok = all(
        (r.installed and r.max_abs_diff is not None and r.max_abs_diff > VISIBLE)
        if not r.check
        else (not r.installed and r.dst_unchanged and r.leaked_blocks == 0 and r.reasons)
        for r in records
    )
    if args.json:
        print(json.dumps({"mismatch": [r.as_dict() for r in records]}))
        return 0 if ok else 1
    t = Table(title="KV installed under another RoPE base / adapter")
    for col in ("mismatch", "manifest check", "outcome", "max |Δlogits|", "decode pool", "leaked"):
        t.add_column(col)
    for r in records:
        check = "on" if r.check else f"off ({SWITCH})"
        outcome = ("installed; ignored: " if r.installed else "refused: ") + "; ".join(r.reasons)
        diff = "-" if r.max_abs_diff is None else f"{r.max_abs_diff:.3g}"
        pool = "unchanged" if r.dst_unchanged else "written"
        t.add_row(r.name, check, outcome, diff, pool, str(r.leaked_blocks))
    con = console()
    con.print(t)
    con.print("as expected" if ok else "[red]unexpected outcome[/red]")
    return 0 if ok else 1
