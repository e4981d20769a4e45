"""Asynchronous compute: a model step is dispatched, then completes (``Config.async_steps``).

Async scheduling (vLLM ``--async-scheduling``, SGLang's overlap scheduler, TensorRT-LLM's
overlap scheduler) dispatches step t+1 before the output of step t is processed. Between
the dispatch and the processing of its output, the step is a writer of the request's
blocks (it appends the new token's KV) and a reader of its prefix. The engines keep the
blocks held until the in-flight step's output has been processed: a request that ends
meanwhile (finished by a stop condition, aborted by the client) has its blocks freed only
after that (vLLM frees a finished request's blocks in ``update_from_output``; SGLang's
``process_batch_result`` releases them one step late).

The model. Each request has one step register per computing worker: ``pstep`` on prefill
(the prefill forward pass, or a decode step run on prefill) and ``dstep`` on decode (0: no
step in flight, 1: a dispatched step not yet completed). With the switch on, the
synchronous steps (``PrefillRun``, ``PrefillDecodeStep``, ``DecodeStep``) are disabled and
become a dispatch + complete pair:

- ``PrefillStepDispatch``: a prefilling request (the forward pass) or a running request
  with a writable, unfrozen prefill replica (a decode step); ``pstep = 1``.
- ``PrefillStepComplete``: ``pstep = 0``; a prefilling request becomes running (what
  ``PrefillRun`` did). A request that ended meanwhile keeps its status: the output is
  discarded.
- ``DecodeStepDispatch`` / ``DecodeStepComplete``: the same on decode's writable replica.

The guard: while a step is in flight, the request's blocks on that worker are not freed
(finish, preempt, quiesce, abort: ``NoReuseUnderIO``) and not frozen (a handoff freeze or
an offload's freeze: ``FrozenSnapshot``). A cancel is accepted at once (the status is
sticky); what it frees waits for the step's completion. A crash takes the worker's
in-flight step with it.

The properties extend the existing ones (no near-duplicate): a step in flight is live
I/O, so ``NoReuseUnderIO`` requires its worker's replica to be held; it is a write, so
``FrozenSnapshot`` requires that replica to be writable.
"""

from __future__ import annotations

from spec.common import NOT_ENABLED, Mutants, Refused, Result, put, refuse
from spec.config import Config
from spec.state import IDLE, NONE, PREFILLING, RUNNING, WRITABLE, Req, World


def step_blocks_free(c: Config, r: Req, worker: str, m: Mutants) -> Refused | None:
    """The refusal of an action that frees ``worker``'s replica of ``r`` ("p" or "d")
    while a step there is in flight (None: no step in flight, or the mutant frees)."""
    if not c.async_steps:
        return None
    if (r.pstep if worker == "p" else r.dstep) and "free_with_step_in_flight" not in m:
        return refuse("NoReuseUnderIO")
    return None


def step_blocks_freeze(c: Config, r: Req, m: Mutants) -> Refused | None:
    """The refusal of an action that freezes prefill's replica of ``r`` (a handoff
    freeze, an offload) while a step still writes it (None: none in flight, or the
    mutant freezes)."""
    if c.async_steps and r.pstep and "freeze_with_step_in_flight" not in m:
        return refuse("FrozenSnapshot")
    return None


def step_blocks_preempt(c: Config, r: Req, m: Mutants) -> Refused | None:
    """The refusal of a preemption of ``r`` while its prefill step is in flight (None:
    none in flight, or the mutant preempts)."""
    if c.async_steps and r.pstep and "preempt_with_step_in_flight" not in m:
        return refuse("NoReuseUnderIO")
    return None


# the dispatches: a request dispatches finitely many steps (its output is finite), so the
# liveness checks leave the cycles these close out (as DecodeStep's self-loop)
DISPATCHES = frozenset({"PrefillStepDispatch", "DecodeStepDispatch"})


def PrefillStepDispatch(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Dispatch a step on prefill: the forward pass of a prefilling request, or a decode
    step of a running request whose prefill replica is writable and not in a handoff."""
    r = w.reqs[i]
    if not c.async_steps or not w.p_up or r.pstep or r.p != WRITABLE or r.ps != IDLE:
        return NOT_ENABLED
    if r.st == PREFILLING or (r.st == RUNNING and r.h == NONE):
        return put(w, i, r._replace(pstep=1))
    return NOT_ENABLED


def PrefillStepComplete(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """The step's output is processed: the blocks it wrote are the request's again; a
    prefilled request runs; an ended one keeps its status (the output is discarded)."""
    r = w.reqs[i]
    if not c.async_steps or not w.p_up or not r.pstep:
        return NOT_ENABLED
    if r.st == PREFILLING:
        return put(w, i, r._replace(pstep=0, st=RUNNING))
    return put(w, i, r._replace(pstep=0))


def DecodeStepDispatch(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """Dispatch a decode step on decode's writable (committed) replica."""
    r = w.reqs[i]
    if not c.async_steps or not w.d_up or r.dstep or r.d != WRITABLE or r.st != RUNNING:
        return NOT_ENABLED
    if r.ti or r.tn:  # between turns nothing decodes (spec/behaviours/turns.py)
        return NOT_ENABLED
    return put(w, i, r._replace(dstep=1))


def DecodeStepComplete(w: World, c: Config, m: Mutants, i: int, arg: int) -> Result:
    """The decode step's output is processed (an ended request's output is discarded)."""
    r = w.reqs[i]
    if not c.async_steps or not w.d_up or not r.dstep:
        return NOT_ENABLED
    return put(w, i, r._replace(dstep=0))


def steps_held(w: World, c: Config) -> bool:
    """NoReuseUnderIO: a step in flight writes blocks its worker still holds."""
    if not c.async_steps:
        return True
    return all(not (r.pstep and r.p == NONE) and not (r.dstep and r.d == NONE) for r in w.reqs)


def steps_write_writable(w: World, c: Config) -> bool:
    """FrozenSnapshot: a step in flight writes a writable replica (never a frozen
    snapshot, a copy being stored, or a replica that is being handed off)."""
    if not c.async_steps:
        return True
    for r in w.reqs:
        if r.pstep and (r.p not in (NONE, WRITABLE) or r.ps != IDLE):
            return False
        if r.dstep and r.d not in (NONE, WRITABLE):
            return False
    return True


def steps_drained(r: Req) -> bool:
    """No step of ``r`` is in flight (part of the quiescent terminal state)."""
    return not r.pstep and not r.dstep


__all__ = [
    "DISPATCHES",
    "DecodeStepComplete",
    "DecodeStepDispatch",
    "PrefillStepComplete",
    "PrefillStepDispatch",
    "step_blocks_free",
    "step_blocks_freeze",
    "step_blocks_preempt",
    "steps_drained",
    "steps_held",
    "steps_write_writable",
]
