"""Partial-order reduction for the local core: ample sets of one request's actions.

Two requests interact only through the global fields (worker liveness, the fault
budget, the shared prefix) and through the actions that read another request's
record. ``local.Locals`` knows, per (slot, record, globals), which actions are *local*
(they read and write only their own record and the globals) and which leave the
globals as they are. At a state with globals ``G``, ``Ample.reduce`` keeps only the
enabled actions of one slot ``i`` (the smallest such set) when:

- C0: slot ``i`` has an enabled action;
- C1 (independence): every action slot ``i`` may take here is local and keeps ``G``;
  no whole-state action (``global``, ``worker``) can be enabled under ``G``; and for
  every other slot ``j``, every record ``j`` can reach by its own actions with ``G``
  fixed (its *closure*) has only local, ``G``-keeping actions. Then no action outside
  the ample set can touch record ``i`` or ``G`` before an ample action runs, so each
  ample action commutes with every path of the others and none enables or disables it;
- C3 (cycle proviso, the BFS form): every ample successor is a new state; otherwise the
  state is fully expanded, so every cycle of the reduced graph has a fully expanded
  state and no action is postponed forever;
- transition properties: every edge in the closures and the ample set has its verdict
  learned from (record, globals) alone, so a postponed edge taken later, from another
  state with the same record and globals, breaks the same properties.

C2 (invisibility) is replaced by the shape of the safety properties: each is checked on
states, and a violation found in the full graph at a state ``t`` has a counterpart in
the reduced graph that agrees with ``t`` on the globals and on every request the
reduction did not run ahead; a property that is a conjunction over requests of a
predicate of (request, globals) is therefore violated there too. The pinned worlds'
verdicts are the check of this (``benchmarks/explore_speed.py --por``). Liveness
(reachability of a goal from every state, fair cycles) is not preserved by ample sets:
the runner does not check it on a reduced graph.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Ample"]


class Ample:
    """Chooses the ample set of a state (or keeps every successor)."""

    def __init__(self, lc: Any, index: dict[tuple[int, ...], int], multi: bool) -> None:
        self.lc, self.index, self.multi = lc, index, multi
        self._safe: set[tuple[int, int, int]] = set()  # (slot, record, globals): closure ok
        self.reduced = 0  # states expanded with an ample set
        self.full = 0  # states fully expanded

    def _local_only(self, i: int, rid: int, gid: int) -> bool:
        """Every action of slot ``i`` for this record is local, keeps the globals and has
        a learned step verdict."""
        for it in self.lc.items(i, rid, gid):
            if not hasattr(it, "rid") or it.gid != gid or it.viol is None:
                return False
        return True

    def _closure_safe(self, j: int, rid: int, gid: int) -> bool:
        if (j, rid, gid) in self._safe:
            return True
        seen = {rid}
        todo = [rid]
        while todo:
            r = todo.pop()
            if (j, r, gid) in self._safe:
                continue
            if not self._local_only(j, r, gid):
                return False
            for it in self.lc.items(j, r, gid):
                if it.rid not in seen:
                    seen.add(it.rid)
                    todo.append(it.rid)
        self._safe.update((j, r, gid) for r in seen)
        return True

    def reduce(self, wid: tuple[int, ...], wg: int, out: list[Any]) -> list[Any]:
        n = len(wid)
        if n < 2 or self.lc.whole_actions(wg):
            self.full += 1
            return out
        best: list[Any] | None = None
        for i in range(n):
            mine = [e for e in out if e[0][1] == i]
            if not mine or (best is not None and len(mine) >= len(best)):
                continue
            if not self._local_only(i, wid[i], wg):
                continue
            if not all(self._closure_safe(j, wid[j], wg) for j in range(n) if j != i):
                continue
            if any(self._key(e) in self.index for e in mine):
                continue  # the cycle proviso: an ample successor was seen before
            best = mine
        if best is None or len(best) == len(out):
            self.full += 1
            return out
        self.reduced += 1
        return best

    def _key(self, e: Any) -> tuple[int, ...]:
        sids, sg = e[1], e[2]
        return (sg, *sorted(sids)) if self.multi else (sg, *sids)
