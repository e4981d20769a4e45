"""Local effects: what one request's actions do, learned once per (slot, record, globals).

Most actions read and write only their own request record and the global fields, and
a state's successors differ from it in one record. ``Locals`` learns, per *local key*
``(slot i, request record, global fields)``, every (action, argument) of slot ``i`` in
the explorer's order, by running the action on a stand-in world that holds the real
record at slot ``i``, the real global fields, and opaque records everywhere else (any
read of them raises: ``enabling._Opaque``). An action that refuses, or returns a world
whose other records are the very same stand-ins, did so without reading them: same
reads, same branches, same result in every state with that key. Its effect is kept as
(new record, new globals), and the transition predicates (``spec.steps.check_step``)
are run once on the stand-in edge the same way: if they finish, the verdict is kept
too. An action (or a step check) that reads another record stays a *call*: the
explorer runs it on the real state, exactly as before.

Records and global tuples are interned (``rec``/``glob``: id -> value; equal values are
one object and one id), so a state is known by small ints: its global id and its record
ids, and the visited set is keyed by those (sorted: the symmetry reduction). Nothing is
assumed about the protocol: the guards and predicates stay in ``spec/``; this only
skips calls whose outcome is already known.

The one assumption (as in ``enabling.py``): spec code compares records by value, using
``is`` only as a shortcut for equality of the same slot before and after a step.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from model_checks.explicit.enabling import Enabling, _Opaque, req_key
from model_checks.explicit.graph import Graph, Label, Run
from model_checks.explicit.por import Ample
from spec.actions import ACTIONS, Action
from spec.common import Mutants, Refused
from spec.config import Config
from spec.state import Req, World, canonical
from spec.steps import check_step, step_plain

_new = tuple.__new__


class Local(NamedTuple):
    """A learned local edge: slot ``lb[1]`` becomes record ``rid``, globals ``gid``;
    ``viol``: the transition properties it breaks (None: check on the real edge)."""

    lb: Label
    rid: int
    gid: int
    viol: tuple[str, ...] | None


class Call(NamedTuple):
    """An (action, argument) whose outcome depends on other records: run it for real."""

    lb: Label
    action: Action


Item = Local | Call


def _same_frame(res: World, sw: World, i: int) -> bool:
    """Are the other records of ``res`` the very stand-ins of ``sw`` (none was read)?"""
    a, b = res[0], sw[0]
    if a is b:
        return True
    if type(a) is not tuple or len(a) != len(b):
        return False
    for k in range(len(b)):
        if k != i and a[k] is not b[k]:
            return False
    return True


class Locals:
    """Interned records and globals, and the learned local edges per local key."""

    def __init__(self, c: Config, m: Mutants, n: int, steps: bool = True) -> None:
        self.c, self.m, self.n, self.steps = c, m, n, steps
        self.en = Enabling(c, m)  # a first filter: actions disabled for the control fields
        # whole-state actions ("global", "worker") and their arguments, in the explorer's order
        self.whole: tuple[tuple[Action, int], ...] = tuple(
            (a, 0) for a in ACTIONS.values() if a.arg == "global"
        ) + tuple((a, wk) for a in ACTIONS.values() if a.arg == "worker" for wk in (0, 1))
        self.rec: list[Req] = []
        self._rid: dict[Req, int] = {}
        self.glob: list[tuple[Any, ...]] = []
        self._gid: dict[tuple[Any, ...], int] = {}
        self._items: dict[tuple[int, int, int], tuple[Item, ...]] = {}
        self._whole: dict[int, tuple[tuple[Action, int], ...]] = {}
        self.learned = 0

    def rid(self, r: Req) -> int:
        got = self._rid.get(r)
        if got is None:
            got = self._rid[r] = len(self.rec)
            self.rec.append(r)
        return got

    def gid(self, g: tuple[Any, ...]) -> int:
        got = self._gid.get(g)
        if got is None:
            got = self._gid[g] = len(self.glob)
            self.glob.append(g)
        return got

    def items(self, i: int, rid: int, gid: int) -> tuple[Item, ...]:
        """The (action, argument)s of slot ``i`` for record ``rid`` under globals ``gid``
        that are not known to be disabled, in the explorer's order."""
        key = (i, rid, gid)
        got = self._items.get(key)
        if got is None:
            got = self._learn(i, self.rec[rid], self.glob[gid])
            if self.n > 1:  # with one request the key is the state: never met again
                self._items[key] = got
            self.learned += 1
        return got

    def _learn(self, i: int, r: Req, g: tuple[Any, ...]) -> tuple[Item, ...]:
        reqs = tuple(r if k == i else _Opaque() for k in range(self.n))
        sw: World = _new(World, (reqs, *g))
        out: list[Item] = []
        key = req_key(_new(World, ((r,) * self.n, *g)), i)
        for a in self.en.req(key):
            self._one(out, sw, a, i, 0)
        seen = -1
        for code in r.net:
            if code != seen:
                seen = code
                for a in self.en.msg(key, code):
                    self._one(out, sw, a, i, code)
        return tuple(out)

    def _one(self, out: list[Item], sw: World, a: Action, i: int, arg: int) -> None:
        lb = (a.name, i, arg)
        try:
            res = a.fn(sw, self.c, self.m, i, arg)
        except Exception:  # _NeedMore, or anything a stand-in provoked: call it for real
            out.append(Call(lb, a))
            return
        if isinstance(res, Refused):
            return
        if type(res) is not World or not _same_frame(res, sw, i):
            out.append(Call(lb, a))
            return
        viol: tuple[str, ...] | None = None
        if self.steps:
            try:
                viol = tuple(check_step(sw, a.name, i, arg, res, self.c))
            except Exception:  # it read another request: check the real edge
                viol = None
        out.append(Local(lb, self.rid(res[0][i]), self.gid(tuple(res[1:])), viol))

    def whole_actions(self, gid: int) -> tuple[tuple[Action, int], ...]:
        """The whole-state actions not known to be disabled under globals ``gid``
        (learned on a world whose every record is opaque)."""
        got = self._whole.get(gid)
        if got is None:
            sw: World = _new(World, (tuple(_Opaque() for _ in range(self.n)), *self.glob[gid]))
            keep = []
            for a, arg in self.whole:
                try:
                    res = a.fn(sw, self.c, self.m, 0, arg)
                except Exception:
                    keep.append((a, arg))
                    continue
                if not isinstance(res, Refused):
                    keep.append((a, arg))
            got = self._whole[gid] = tuple(keep)
        return got


# one successor: (label, its record ids in slot order, its global id, the step's broken
# transition properties or None (check the real edge), the real successor or None)
Out = tuple[Label, tuple[int, ...], int, "tuple[str, ...] | None", "World | None"]


def explore_local(run: Run, symmetry: bool, por: bool = False) -> Graph:
    """The local core: the same BFS as ``explore``'s plain one, over learned local edges
    and interned ids (and, with ``por``, over ample sets: ``por.Ample``)."""
    g, c, mutants = run.g, run.c, run.m
    edge_props, check, check_edge, stops = run.edge_props, run.check, run.check_edge, run.stops
    progress = run.progress
    init = canonical(c.initial()) if symmetry else c.initial()
    n = c.n_reqs
    lc = Locals(c, mutants, n)
    rid, gid, rec, glob = lc.rid, lc.gid, lc.rec, lc.glob
    items, whole = lc.items, lc.whole_actions
    init_ids = tuple(rid(r) for r in init.reqs)
    init_g = gid(tuple(init[1:]))
    multi = symmetry and n > 1
    two = multi and n == 2
    index: dict[tuple[int, ...], int] = {_key(init_g, init_ids, multi): 0}
    ids: list[tuple[int, ...]] = [init_ids]  # per state: its record ids, in its slot order
    gids: list[int] = [init_g]
    g.states.append(init)
    g.depth.append(0)
    g.parent.append(0)
    g.parent_label.append(("", 0, 0))
    first_step = g.first_step_violation
    states, depth, parent, plabel = g.states, g.depth, g.parent, g.parent_label
    src, dst, lab = g.src, g.dst, g.lab
    first_edge = g.first_edge
    ample = Ample(lc, index, multi) if por else None
    World_ = World

    def real(w: World, wid: tuple[int, ...], s: World) -> tuple[tuple[int, ...], int]:
        # record ids and global id of a successor built by a real call
        sr, wr = s[0], w[0]
        return tuple(wid[k] if sr[k] is wr[k] else rid(sr[k]) for k in range(n)), gid(s[1:])

    if check(0, init):
        return run.done()
    head = 0
    while head < len(states):
        sid = head
        w = states[sid]
        wid = ids[sid]
        wg = gids[sid]
        head += 1
        d1 = depth[sid] + 1
        first_edge.append(len(src))
        out: list[Out] = []
        for i in range(n):
            for it in items(i, wid[i], wg):
                if type(it) is Local:
                    out.append((it.lb, (*wid[:i], it.rid, *wid[i + 1 :]), it.gid, it.viol, None))
                else:
                    lb = it.lb
                    s = it.action.fn(w, c, mutants, i, lb[2])  # type: ignore[union-attr]
                    if type(s) is World_:
                        out.append((lb, *real(w, wid, s), None, s))
        for a, arg in whole(wg):
            s = a.fn(w, c, mutants, 0, arg)
            if type(s) is World_:
                out.append(((a.name, 0, arg), *real(w, wid, s), None, s))
        if ample is not None:
            out = ample.reduce(wid, wg, out)
        for lb, sids, sg, viol, s0 in out:
            stop = False
            if s0 is None and (viol is None or edge_props):
                s0 = _new(World_, (tuple([rec[k] for k in sids]), *glob[sg]))
            if viol is None:
                assert s0 is not None
                name, i, arg = lb
                plain = step_plain(w, name, i, arg, s0, c)
                viol = () if plain else tuple(check_step(w, name, i, arg, s0, c))
            for pid in viol:
                if pid not in first_step:
                    first_step[pid] = len(src)  # the index this edge gets below
                    stop = stop or stops(pid)
            if two:
                a0, a1 = sids
                key: tuple[int, ...] = (sg, a1, a0) if a1 < a0 else (sg, a0, a1)
            else:
                key = _key(sg, sids, multi)
            tid = index.get(key)
            if tid is None:
                tid = len(states)
                index[key] = tid
                reqs = [rec[k] for k in sids]
                if multi:
                    order = sorted(range(n), key=reqs.__getitem__)
                    reqs = [reqs[k] for k in order]
                    sids = tuple([sids[k] for k in order])
                s = _new(World_, (tuple(reqs), *glob[sg]))
                states.append(s)
                ids.append(sids)
                gids.append(sg)
                depth.append(d1)
                parent.append(sid)
                plabel.append(lb)
                if check(tid, s):
                    src.append(sid)
                    dst.append(tid)
                    lab.append(lb)
                    return run.done()
                run.too_many(tid)
            if edge_props:
                assert s0 is not None
                if check_edge(sid, w, lb, s0, len(src)):
                    src.append(sid)
                    dst.append(tid)
                    lab.append(lb)
                    return run.done()
            src.append(sid)
            dst.append(tid)
            lab.append(lb)
            if stop:
                return run.done()
        if progress is not None and head % 4096 == 0:
            progress(len(states), len(states) - head)
    return run.done()


def _key(gid: int, ids: tuple[int, ...], sort: bool) -> tuple[int, ...]:
    """The visited-set key of a state: its global id and its record ids (sorted under
    symmetry: equal up to a permutation of the requests is one state)."""
    return (gid, *sorted(ids)) if sort else (gid, *ids)
