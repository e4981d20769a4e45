"""The harness's own oracle for KV content: a ghost kept from the steps, not from the engine.

The engine keeps a ground truth of its own (``truth``), which ``PrefillRun`` writes: a
recompute that loses the generated tokens' KV rewrites its truth the same wrong way, and
the engine's ``damaged()`` stays empty while the bytes change. The ghost does not ask the
engine what the content should be. It keeps, per request, the number of tokens generated
so far (accepted token steps), and the count at each snapshot (a handoff attempt's
freeze, an offload's begin). The content is then a function of those counts:

    prompt block j   the model's KV of the prompt block (the shared prefix for j < prefix;
                     every block, in a host-cache world, where the prompt is shared)
    token t          the model's KV of token t, in slot (lo + t % private,
                     (t // private) % block_size), private = blocks - lo: the tokens
                     cycle over the private slots of the window, lo = max(prefix, pw)
                     with pw the blocks pruned out of the window when token t was made
                     (the spec's ``pw``, kept as a history: ``window``)

("the model" is ``refimpl.engine.data.gen``, seeded by the engine's seed: the stand-in
for a real model's forward pass, which engine and ghost both call). Which replica must
hold what comes from the *spec's* state (the oracle's, not the engine's): a writable
replica the current content, a complete one the content at its snapshot (a frozen source
or a validated destination: the attempt's freeze; a host copy: the offload's begin).
So recompute, reload, reshard and handoff must each reproduce exactly the content from
before the move.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from refimpl.engine.data import gen
from spec.state import COMPLETE, IDLE, PREFILLING, WRITABLE, World

TOKEN_STEPS = frozenset({"PrefillDecodeStep", "DecodeStep"})


class Ghost:
    """Expected KV content per request, from the history of accepted steps."""

    def __init__(
        self,
        *,
        n_reqs: int,
        blocks: int,
        prefix: int,
        block_shape: tuple[int, ...],  # [layers, 2, H, block_size, head_dim]
        dtype: torch.dtype,
        seed: int,
        read: Callable[[int, str], torch.Tensor | None],  # replica [n, *block_shape]
        shared_prompt: bool = False,  # every request has the same prompt (a host-cache world)
    ) -> None:
        self.n, self.prefix, self.shape, self.dtype, self.seed = (
            blocks,
            prefix,
            block_shape,
            dtype,
            seed,
        )
        self.read, self.shared_prompt = read, shared_prompt
        self.tokens = [0] * n_reqs  # tokens generated so far
        self.frozen: list[dict[int, int]] = [{} for _ in range(n_reqs)]  # epoch -> tokens
        self.stored = [0] * n_reqs  # tokens when the last offload began
        self.computed = [False] * n_reqs  # PrefillRun ran since the last admission
        self.forward = [False] * n_reqs  # the prefill step in flight is the forward pass
        self.window: list[list[tuple[int, int]]] = [[] for _ in range(n_reqs)]  # (tokens, pw)
        self._cache: dict[tuple[int, int, tuple[tuple[int, int], ...]], torch.Tensor] = {}

    # ---------------------------------------------------------------- history
    def observe(self, name: str, i: int, after: World) -> None:
        """An accepted step ``name`` on request ``i``; ``after``: the spec's new state."""
        pw, cuts = after.reqs[i].pw, self.window[i]
        if pw != (cuts[-1][1] if cuts else 0):  # a prune, or a whole copy again
            cuts.append((self.tokens[i], pw))
        if name in TOKEN_STEPS:
            self.tokens[i] += 1
        elif name in ("PrefillAdmit", "PrefillRun"):
            self.computed[i] = name == "PrefillRun"  # admitted blocks hold nothing yet
        elif name == "PrefillFreeze":
            self.frozen[i][after.reqs[i].ep] = self.tokens[i]
        elif name in ("PrefillOffloadBegin", "HostStoreBegin"):
            self.stored[i] = self.tokens[i]
        else:
            self._observe_async(name, i, after)

    def _observe_async(self, name: str, i: int, after: World) -> None:
        """Async steps: a completed forward pass is ``PrefillRun``'s write, a completed
        token step a token step's (into the request's own writable replica)."""
        r = after.reqs[i]
        if name == "PrefillStepDispatch":
            self.forward[i] = r.st == PREFILLING
        elif name == "PrefillStepComplete" and self.forward[i]:
            self.computed[i] = r.p == WRITABLE
        elif name == "PrefillStepComplete" and r.p == WRITABLE:
            self.tokens[i] += 1
        elif name == "DecodeStepComplete" and r.d == WRITABLE:
            self.tokens[i] += 1

    # ---------------------------------------------------------------- content
    def content(self, i: int, tokens: int) -> torch.Tensor:
        """Request i's full replica after ``tokens`` tokens: [n, layers, 2, H, bs, D]."""
        cuts = tuple(self.window[i])
        key = (i, tokens, cuts)
        got = self._cache.get(key)
        if got is not None:
            return got
        blocks = [
            gen(self.shape, self.dtype, self.seed, "prefix", j)
            if j < self.prefix or self.shared_prompt
            else gen(self.shape, self.dtype, self.seed, "req", i, j)
            for j in range(self.n)
        ]
        kv = torch.stack(blocks)
        private, bs = (0 if self.shared_prompt else self.n - self.prefix), self.shape[3]
        tok_shape = (self.shape[0], self.shape[1], self.shape[2], self.shape[4])
        for t in range(tokens if private else 0):
            lo = max(self.prefix, next((pw for at, pw in reversed(cuts) if at <= t), 0))
            j, s = lo + t % (self.n - lo), (t // (self.n - lo)) % bs
            kv[j, :, :, :, s] = gen(tok_shape, self.dtype, self.seed, "tok", i, t)
        self._cache[key] = kv
        return kv

    def problems(self, w: World) -> list[str]:
        """Replicas (by the spec's state ``w``) whose bytes are not the ghost's content."""
        out = []
        for i, r in enumerate(w.reqs):
            froze = self.frozen[i].get(r.ep, self.tokens[i])
            want = {
                "p": None
                if not self.computed[i]
                else self.tokens[i]
                if r.p == WRITABLE
                else (froze if r.ps != IDLE else self.stored[i])
                if r.p == COMPLETE
                else None,
                "h": self.stored[i] if r.h == COMPLETE else None,
                "d": self.tokens[i]
                if r.d == WRITABLE
                else self.frozen[i].get(r.dep)
                if r.d == COMPLETE
                else None,
            }
            for where, k in want.items():
                if k is None:
                    continue
                rep, kv = self.read(i, where), self.content(i, k)
                kv = kv[r.pw :] if where == "p" else kv  # the window's blocks (spec pw)
                if rep is None or not torch.equal(rep, kv):
                    out.append(f"r{i}@{where} (ghost: {k} tokens)")
        return out
