"""z3 mirror of ``spec/behaviours/decode_ranks.py``: per-decode-rank install.

``dmask`` is a 4-bit vector in both domains (``dst_tp`` is at most 4); ``Params.dst_full``
is the mask of every decode rank, 0 when the config does not model decode ranks.
"""

from __future__ import annotations

from model_checks.symbolic.core import EQ, RV, Ctx, Msg, N, O, Rules, Z
from spec.state import COMPLETE, RUNNING

__all__ = ["DecodeRankInstall", "ranks_installed"]


def DecodeRankInstall(x: Ctx, r: RV, a: Msg | None) -> Rules:
    c, R = x.c, Rules("DecodeRankInstall")
    R.no(O(N(c.decode_ranks), N(x.d_up), r.d != COMPLETE, EQ(r.dmask, c.dst_full)))
    R.no(r.st != RUNNING, "StickyEnd")
    R.go(dmask=r.dmask | (r.dmask + 1))
    return R


def ranks_installed(x: Ctx, r: RV) -> Z:
    """``spec.behaviours.decode_ranks.ranks_installed``."""
    full = x.c.dst_full
    if "decode_runs_before_all_ranks" in x.m:
        return O(r.dmask != 0, EQ(full, 0))
    return EQ(r.dmask, full)
