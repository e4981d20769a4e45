"""The spec's transition system for ANY number of requests, blocks and capacity (z3).

System.  Requests are an uninterpreted sort ``Req``; each ``Req`` field is an array
from it (``landed``: a set of chunk indices, an array ``Int -> Bool``); the messages
in flight are one array ``net[r, kind, epoch, idx] -> count``. Every config bound is
a symbolic constant (blocks, capacities, prefix, attempts, moves, fault budget, which
features and fault kinds are on), except ``src_tp``, which is concrete so that chunk
indices (rank * per_rank + pos) stay linear; ``UModel(src_tp)`` is one instance per
TP degree. The mutants are off but in the tests of a proof's teeth (``UModel(mutants=)``).

Model.  The actions are the traced ones (``actions.PER_REQ``, ``symbolic.trace``). A per-
request action is "some request ``r0`` takes it": each field array becomes
``Store(f, r0, new)`` and every other request is unchanged (the frame);
``DecodeEvictPrefix`` changes globals only; ``EnvCrash`` maps every request at once
(arrays as lambdas). Pool usage is kept in ghost counters, maintained by the
transition: ``used_p`` (blocks of requests with a prefill replica), ``used_h`` (host),
``used_d_own`` (decode blocks held beyond the shared prefix) and ``refs`` (requests
holding a prefix reference). A per-request action changes a counter by the acting
request's new minus old contribution; since no other request changes, the counter
stays equal to the sum it counts. A crash empties what it frees (counter := 0).

Harness.  ``z3_induction`` states the invariants over states of this model.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import z3

from model_checks.symbolic.actions import (
    FINITE_ONLY,
    GLOBAL,
    GLOBAL_FNS,
    PER_REQ,
    EnvCrash,
)
from model_checks.symbolic.core import (
    BV_FIELDS,
    FIELDS,
    ITE,
    RV,
    TURN_FIELDS,
    A,
    Ctx,
    Go,
    Msg,
    NetOp,
    NetView,
    O,
    Params,
    Z,
)
from spec.actions import ACTIONS
from spec.config import FAULT_KINDS
from spec.state import M_CHUNK, M_CHUNK_BAD, M_CHUNK_UNSTAGED, MSG_NAMES, NONE, TO_DECODE

REQ = z3.DeclareSort("Req")
UFIELDS = FIELDS + TURN_FIELDS  # the arrays: the core's, multi-turn append's (turns free)
UNBOUNDED_TOO = ("spec.behaviours.turns",)  # of actions.FINITE_ONLY's modules
INT = z3.IntSort()
COUNTERS = ("used_p", "used_h", "used_d_own", "refs")


def sym_params(src_tp: int) -> tuple[Params, list[tuple[str, Z]]]:
    """Symbolic config bounds and the facts every config satisfies (named)."""
    i = {n: z3.Int(f"cfg_{n}") for n in ("blocks", "cap_p", "cap_d", "cap_h", "prefix")}
    j = {n: z3.Int(f"cfg_{n}") for n in ("faults", "max_attempts", "max_moves")}
    b = {
        n: z3.Bool(f"cfg_{n}")
        for n in (
            "handoff",
            "offload",
            "recompute",
            "cancel",
            "async_steps",
            "revocable",
            "decode_failure",
        )
    }
    p = Params(
        blocks=i["blocks"],
        src_tp=src_tp,
        cap_p=i["cap_p"],
        cap_d=i["cap_d"],
        cap_h=i["cap_h"],
        prefix=i["prefix"],
        handoff=b["handoff"],
        offload=b["offload"],
        recompute=b["recompute"],
        cancel=b["cancel"],
        faults=j["faults"],
        max_attempts=j["max_attempts"],
        max_moves=j["max_moves"],
        fault_kinds={k: z3.Bool(f"cfg_fault_{k}") for k in sorted(FAULT_KINDS)},
        async_steps=b["async_steps"],
        revocable=b["revocable"],
        decode_failure=b["decode_failure"],
        retract=z3.Bool("cfg_retract"),
        decode_ranks=z3.Bool("cfg_decode_ranks"),
        dst_full=z3.BitVec("cfg_dst_full", 4),
        turns=z3.Bool("cfg_turns"),
        max_turns=z3.Int("cfg_max_turns"),
    )
    facts = [
        ("cfg: blocks >= 1", p.blocks >= 1),
        ("cfg: 0 <= prefix <= blocks", z3.And(p.prefix >= 0, p.prefix <= p.blocks)),
        ("cfg: prefix <= cap_d", p.prefix <= p.cap_d),
        ("cfg: capacities >= 0", z3.And(p.cap_p >= 0, p.cap_h >= 0)),
        ("cfg: max_attempts >= 1", p.max_attempts >= 1),
        ("cfg: max_turns >= 1", p.max_turns >= 1),
        ("cfg: budgets >= 0", z3.And(p.faults >= 0, p.max_moves >= 0)),
        (
            "cfg: dst_full is 2^dst_tp - 1, or 0",
            z3.Or(*(p.dst_full == v for v in (0, 1, 3, 7, 15))),
        ),
        ("cfg: decode_ranks iff dst_full != 0", p.decode_ranks == (p.dst_full != 0)),
    ]
    return p, facts


def field_sort(f: str, src_tp: int) -> Any:
    if f == "landed":
        return z3.ArraySort(INT, z3.BoolSort())
    if f == "rmask":
        return z3.BitVecSort(src_tp)
    if f == "dfl":
        return z3.BitVecSort(BV_FIELDS["dfl"])
    if f == "g":
        return z3.BitVecSort(6)
    if f == "dmask":
        return z3.BitVecSort(4)
    return INT


class UState:
    """One symbolic state: field arrays, the message array, globals, ghost counters."""

    def __init__(self, tag: str, src_tp: int) -> None:
        self.tag = tag
        self.f = {f: z3.Array(f"{f}@{tag}", REQ, field_sort(f, src_tp)) for f in UFIELDS}
        self.net = z3.Array(f"net@{tag}", REQ, INT, INT, INT, INT)
        self.g: dict[str, Z] = {
            "faults": z3.Int(f"faults@{tag}"),
            "pfx_ref": z3.Int(f"pfx_ref@{tag}"),
            **{n: z3.Bool(f"{n}@{tag}") for n in ("p_up", "d_up", "pfx", "pfx_ok")},
        }
        self.k = {n: z3.Int(f"{n}@{tag}") for n in COUNTERS}


Probe = tuple[Z, Z, Z, Z]  # (request, kind, epoch, idx): a message the query looks at


class UNet(NetView):
    """Messages of request ``r``. ``no_chunks`` is a fresh Boolean that implies "no chunk
    of that epoch in flight" at every probed message (``side`` collects those facts), and
    ``empty`` one that implies no message at all there: the relation over-approximates
    the spec's (a proof over it is one of the spec)."""

    def __init__(self, s: UState, r: Z, probes: Sequence[Probe], side: list[Z]) -> None:
        self.s, self.r, self.probes, self.side = s, r, probes, side

    def count(self, kind: int, e: Z, i: Z) -> Z:
        return self.s.net[self.r, kind, e, i]

    def no_chunks(self, e: Z) -> Z:
        b = z3.Bool(f"no_chunks_{len(self.side)}@{self.s.tag}")
        facts = []
        for pr, pk, pe, pi in self.probes:
            kinds = z3.Or(pk == M_CHUNK, pk == M_CHUNK_BAD, pk == M_CHUNK_UNSTAGED)
            chunk = z3.And(pr == self.r, kinds, pe == e)
            facts.append(z3.Implies(chunk, self.s.net[pr, pk, pe, pi] == 0))
        self.side.append(z3.Implies(b, z3.And(*facts)))
        return b

    def empty(self) -> Z:
        """``not r.net``: as ``no_chunks``, no message of the request at every probe."""
        b = z3.Bool(f"no_msgs_{len(self.side)}@{self.s.tag}")
        facts = [z3.Implies(p[0] == self.r, self.s.net[p] == 0) for p in self.probes]
        self.side.append(z3.Implies(b, z3.And(*facts)))
        return b


class UCtx(Ctx):
    def __init__(self, p: Params, s: UState) -> None:
        self.c, self.m, self.s = p, frozenset(), s
        self.faults, self.pfx_ref = s.g["faults"], s.g["pfx_ref"]
        self.p_up, self.d_up, self.pfx = s.g["p_up"], s.g["d_up"], s.g["pfx"]
        self.pfx_ok = s.g["pfx_ok"]

    def used_p(self) -> Z:
        return self.s.k["used_p"]

    def used_h(self) -> Z:
        return self.s.k["used_h"]

    def used_d(self) -> Z:
        return self.s.k["used_d_own"] + ITE(self.pfx, self.c.prefix, 0)

    def refs(self) -> Z:
        return self.s.k["refs"]

    def admit_possible(self) -> Z:
        raise NotImplementedError("sweep_only_on_admit is not modelled for unbounded requests")

    def lempty(self) -> Z:
        return z3.K(INT, z3.BoolVal(False))

    def ladd(self, s: Z, idx: Z) -> Z:
        return z3.Store(s, idx, True)

    def lfull(self, s: Z, hit: Z) -> Z:
        k = z3.Int("k")
        return s == z3.Lambda([k], z3.And(k >= 0, k < self.c.src_tp * (self.c.blocks - hit)))


def contributions(c: Params, r: RV) -> dict[str, Z]:
    """What one request adds to each ghost counter (``spec.common.used_*``)."""
    return {
        "used_p": ITE(r.p != NONE, c.blocks, 0),
        "used_h": ITE(r.h != NONE, c.blocks, 0),
        "used_d_own": ITE(r.d != NONE, c.blocks - r.hit, 0),
        "refs": ITE(z3.And(r.d != NONE, r.hit > 0), 1, 0),
    }


@dataclass(frozen=True)
class UAction:
    """A transition of the unbounded model: a spec action, with the kind of message it
    consumes (msg actions: one UAction per kind) or the crashed worker."""

    name: str
    kind: int | None = None  # message kind consumed
    worker: int | None = None

    @property
    def label(self) -> str:
        if self.kind is not None:
            return f"{self.name}({MSG_NAMES[self.kind]})"
        if self.worker is not None:
            return f"{self.name}({('prefill', 'decode')[self.worker]})"
        return self.name


class UModel:
    def __init__(self, src_tp: int = 2, mutants: frozenset[str] = frozenset()) -> None:
        self.src_tp, self.mutants = src_tp, frozenset(mutants)  # mutants: a proof's teeth
        self.params, self.param_facts = sym_params(src_tp)

    def state(self, tag: str) -> UState:
        return UState(tag, self.src_tp)

    def view(
        self, s: UState, r: Z, probes: Sequence[Probe] = (), side: list[Z] | None = None
    ) -> RV:
        net = UNet(s, r, probes, side if side is not None else [])
        return RV(**{f: s.f[f][r] for f in UFIELDS}, net=net)

    def ctx(self, s: UState) -> UCtx:
        x = UCtx(self.params, s)
        x.m = self.mutants
        return x

    def actions(self) -> Iterator[UAction]:
        """Every transition of the model; the unencoded actions (restarts) and those of the
        host cache and turns (``FINITE_ONLY``) are not in it: the proofs cover the worlds
        without them (INVARIANTS.md)."""
        for name, a in ACTIONS.items():
            if name in FINITE_ONLY and ACTIONS[name].fn.__module__ not in UNBOUNDED_TOO:
                continue
            if a.arg == "msg":
                yield from (UAction(name, kind=k) for k in sorted(a.msgs))
            elif a.arg == "worker":
                yield from (UAction(name, worker=w) for w in (0, 1))
            else:
                yield UAction(name)

    def init(self, s: UState, probes: Sequence[Probe]) -> Z:
        """The initial state (the message array: empty at every probed message)."""
        c = self.params
        eqs = [s.f[f] == z3.K(REQ, _zero(field_sort(f, self.src_tp))) for f in UFIELDS]
        eqs += [s.net[p] == 0 for p in probes]
        eqs += [s.g["faults"] == 0, s.g["pfx_ref"] == 0, s.g["p_up"], s.g["d_up"], s.g["pfx_ok"]]
        eqs.append(s.g["pfx"] == (c.prefix > 0))
        eqs += [v == 0 for v in s.k.values()]
        return A(*eqs)

    def trans(
        self, act: UAction, s: UState, t: UState, r0: Z, msg: Msg | None, probes: Sequence[Probe]
    ) -> Z:
        """``act`` taken by request ``r0`` (consuming ``msg``): every field array is
        ``Store(f, r0, new)`` or unchanged (the frame); the message array is given at
        the probed messages (the frame there: unchanged unless r0's own op hits it)."""
        x = self.ctx(s)
        if act.name == "EnvCrash":
            assert act.worker is not None
            return self._crash(x, s, t, act.worker, probes)
        side: list[Z] = []
        if act.name in GLOBAL:
            fn = GLOBAL_FNS[act.name]
            cases = [(g, go) for g, go, _ in fn(x).cases()]
            return self._frame(x, s, t, r0, cases, None, probes)
        r = self.view(s, r0, probes, side)
        cases = [(g, go) for g, go, _ in PER_REQ[act.name](x, r, msg).cases()]
        present = s.net[r0, msg.kind, msg.e, msg.i] >= 1 if msg is not None else True
        return A(present, *side, self._frame(x, s, t, r0, cases, r, probes))

    def _frame(
        self,
        x: UCtx,
        s: UState,
        t: UState,
        r0: Z,
        cases: list[tuple[Z, Go]],
        r: RV | None,
        probes: Sequence[Probe],
    ) -> Z:
        eqs = [O(*(g for g, _ in cases))]
        new: dict[str, Z] = {}
        for f in UFIELDS:
            val = s.f[f][r0]
            for g, go in cases:
                if f in go.req:
                    val = ITE(g, _lift(go.req[f], val), val)
            new[f] = val
            changed = any(f in go.req for _, go in cases)
            eqs.append(t.f[f] == (z3.Store(s.f[f], r0, val) if changed else s.f[f]))
        for p in probes:
            val = s.net[p]
            for g, go in cases:
                if go.net:
                    val = ITE(g, self._ops(x, s.net[p], p, r0, go.net), val)
            eqs.append(t.net[p] == val)
        for name, pre in s.g.items():
            val = pre
            for g, go in cases:
                if name in go.glob:
                    val = ITE(g, go.glob[name], val)
            eqs.append(t.g[name] == val)
        old = contributions(self.params, r) if r is not None else None
        post = RV(**new, net=r.net) if r is not None else None
        for name, pre in s.k.items():
            if old is None or post is None:
                eqs.append(t.k[name] == pre)
            else:
                eqs.append(t.k[name] == pre + contributions(self.params, post)[name] - old[name])
        return A(*eqs)

    def _ops(self, x: UCtx, v: Z, p: Probe, r0: Z, ops: tuple[NetOp, ...]) -> Z:
        """The count at probe ``p`` after r0's message ops (``spec.common`` send/take)."""
        pr, pk, pe, pi = p
        for op in ops:
            if op.op == "drop":
                chunk = z3.Or(pk == M_CHUNK, pk == M_CHUNK_BAD, pk == M_CHUNK_UNSTAGED)
                v = ITE(A(op.when, pr == r0, chunk, pe == op.e), 0, v)
                continue
            when = op.when
            if op.op == "send":
                when = A(when, x.d_up if op.kind in TO_DECODE else x.p_up)
            at = A(when, pr == r0, pk == op.kind, pe == op.e, pi == op.i)
            v = ITE(at, v - 1 if op.op == "take" else v + 1, v)
        return v

    def _crash(self, x: UCtx, s: UState, t: UState, worker: int, probes: Sequence[Probe]) -> Z:
        """Every request changes: given at each probed request (and message)."""
        cr = EnvCrash(x, worker)
        eqs = [cr.cond]
        for y in dict.fromkeys(p[0] for p in probes):
            per = cr.per_req(self.view(s, y))
            eqs += [t.f[f][y] == _lift(per[f], s.f[f][y]) for f in UFIELDS if f in per]
            eqs += [t.f[f][y] == s.f[f][y] for f in UFIELDS if f not in per]
        for p in probes:
            keep = z3.Or(*(p[1] == kind for kind in sorted(cr.keep)))
            eqs.append(t.net[p] == z3.If(keep, s.net[p], 0))
        for name, pre in s.g.items():
            eqs.append(t.g[name] == cr.glob.get(name, pre))
        emptied = ("used_p", "used_h") if worker == 0 else ("used_d_own", "refs")
        for name, pre in s.k.items():
            eqs.append(t.k[name] == (0 if name in emptied else pre))
        return A(*eqs)


def _zero(sort: Any) -> Any:
    if sort == INT:
        return z3.IntVal(0)
    if isinstance(sort, z3.BitVecSortRef):
        return z3.BitVecVal(0, sort.size())
    return z3.K(INT, z3.BoolVal(False))


def _lift(v: Z, like: Z) -> Z:
    """A Python constant as a term of ``like``'s sort."""
    if isinstance(v, z3.ExprRef):
        return v
    if isinstance(like.sort(), z3.BitVecSortRef):
        return z3.BitVecVal(v, like.sort().size())
    return z3.IntVal(v)
