"""Decode TP ranks: each decode rank installs its own shard; the request runs only when
every one of them has.

Engines: in vLLM each worker reports the requests whose KV it has received
(``finished_recving``) and the scheduler-side aggregator counts a request done only
when every worker of the world has reported it; SGLang's decode scheduler all-reduces
the transfer poll state over its TP group and takes the minimum, so the request runs
only when every rank's receiver succeeded. A rank that runs its shard of the request
before another rank has its shard reads KV that is not there.

Model (``Config.decode_ranks``, for ``dst_tp`` decode ranks): after ``DecodeValidate``
(every chunk landed, every source rank reported, the manifest fits), each decode rank
installs its shard (``DecodeRankInstall``: one rank per step; the field ``dmask`` is the
set of decode ranks that installed). ``DecodeCommit`` (the commit point, after which
decode steps) needs every decode rank (``RankAgreement`` otherwise). The property
``RankAgreement`` covers the receiving side too: a committed replica has every decode
rank installed, ``dmask`` is empty unless decode holds a validated replica, and a rank
counts only from its own install step (``spec/steps.py``). The ranks are symmetric in
the model (every shard arrives in the validated replica), so an install takes the
lowest rank not yet installed.

Bug (``spec/mutants.py``): ``decode_runs_before_all_ranks`` commits on the first
rank's report (the scheduler reads rank 0 only).
"""

from __future__ import annotations

from spec.common import NOT_ENABLED, Mutants, Result, put, refuse
from spec.config import Config
from spec.state import COMPLETE, RUNNING, World

__all__ = ["DecodeRankInstall", "all_dst_ranks", "ranks_installed"]


def all_dst_ranks(c: Config) -> int:
    """The bitmask of every decode rank (0 when the ranks are not modelled)."""
    return (1 << c.dst_tp) - 1 if c.decode_ranks else 0


def DecodeRankInstall(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """The next decode rank installs its shard of the validated replica."""
    r = w.reqs[i]
    full = all_dst_ranks(c)
    if not c.decode_ranks or not w.d_up or r.d != COMPLETE or r.dmask == full:
        return NOT_ENABLED
    if r.st != RUNNING:
        return refuse("StickyEnd")
    return put(w, i, r._replace(dmask=r.dmask | (r.dmask + 1)))  # the lowest rank not in


def ranks_installed(r_dmask: int, c: Config, m: Mutants) -> bool:
    """May decode commit? Every decode rank installed (the mutant: any one of them)."""
    full = all_dst_ranks(c)
    if "decode_runs_before_all_ranks" in m:
        return r_dmask != 0 or full == 0
    return r_dmask == full
