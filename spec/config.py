"""Finite instances of the spec (``Config``: no action hard-codes a size) and the suites:
small focused worlds, bigger ``SCALE`` ones; outcomes pinned in ``spec/pinned.json``."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from spec.behaviours import turn_worlds as TW
from spec.behaviours.host_cache_worlds import HC_DEEP, HC_DEFAULT, HC_FAULTS, HC_WORLDS
from spec.behaviours.worlds import COMPOSED, DERIVED, DERIVED_DEEP, DERIVED_DEFAULT, WINDOW
from spec.state import COMPLETE, Req, World
from spec.stream.worlds import STREAM_DEEP, STREAM_DEFAULT, STREAM_WORLDS, layer_problems

FAULT_KINDS = frozenset({"lose", "duplicate", "corrupt", "mismatch", "crash", "store_fail"})


@dataclass(frozen=True)
class Config:
    name: str
    doc: str
    n_reqs: int = 1  # interchangeable requests
    blocks: int = 2  # KV blocks per request (n)
    src_tp: int = 1  # prefill TP ranks (each sends its own chunks and RankDone)
    dst_tp: int = 1  # decode TP ranks (the spec reads it with decode_ranks; refimpl reshards)
    cap_p: int = 2  # prefill GPU pool capacity, in blocks
    cap_d: int = 2  # decode GPU pool capacity, in blocks (prefix blocks included)
    cap_h: int = 0  # host pool capacity, in blocks
    prefix: int = 0  # shared prefix blocks resident on decode at start (0: none)
    handoff: bool = True  # prefill -> decode handoff enabled
    offload: bool = False  # offload/reload to host enabled
    recompute: bool = False  # preempt-by-recompute enabled
    cancel: bool = True  # the client may cancel
    faults: int = 0  # fault budget (environment actions that consume it)
    fault_kinds: frozenset[str] = field(default_factory=frozenset)
    max_attempts: int = 2  # handoff epochs per request
    max_moves: int = 1  # offloads + preemptions per request
    async_steps: bool = False  # steps are dispatched, then complete (spec/behaviours/async_steps)
    revocable: bool = True  # decode can fence an attempt's writes (False: RDMA / a NIXL batch)
    decode_failure: bool = False  # decode may fail an attempt on its own error (DecodeFail)
    retract: bool = False  # decode may retract a committed copy (refetch: recompute)
    decode_ranks: bool = False  # each of the dst_tp decode ranks installs its own shard
    restarts: int = 0  # crashed workers that may come back (EnvRestart), in all
    identity: bool = False  # content identity: staging, per-block hashes (behaviours/identity)
    slots: bool = False  # one metadata slot on decode, reused across requests (behaviours/slots)
    host_cache: int = 0  # shared host cache (behaviours/host_cache): 0 off, 1 cold, 2 warm
    turns: bool = False  # multi-turn append on decode (PPD; spec/behaviours/turns)
    max_turns: int = 1  # turns appended after the first, per request (turns worlds)
    layers: int = 0  # streamed offers, layer by layer (spec/stream): 0 off, else layers each
    window: bool = False  # a running request frees blocks out of its window (spec/window)
    from_log: bool = False  # a log's world (spec/behaviours/compose.py): no explorer runs it

    def __post_init__(self) -> None:
        problems = []
        most, blocks, restarts = (4096, 15, 15) if self.from_log else (4, 4, 3)  # from_log: no BFS
        if not 1 <= self.n_reqs <= most:
            problems.append(f"n_reqs={self.n_reqs} not in 1..{most}")
        if not 1 <= self.blocks <= blocks:
            problems.append(f"blocks={self.blocks} not in 1..{blocks}")
        if not 1 <= self.src_tp <= 4 or self.src_tp * self.blocks > 15:
            problems.append(f"src_tp={self.src_tp} with blocks={self.blocks} too large")
        if not 0 <= self.prefix <= min(self.blocks, self.cap_d):
            problems.append(f"prefix={self.prefix} not in 0..blocks or does not fit in cap_d")
        if self.host_cache == 2 and self.blocks > self.cap_h:  # the warm copy is resident
            problems.append("a warm host cache (host_cache=2) does not fit in cap_h")
        for f in ("max_attempts", "max_turns"):
            if not 1 <= getattr(self, f) <= 15:
                problems.append(f"{f}={getattr(self, f)} not in 1..15")
        if not 1 <= self.dst_tp <= 4:
            problems.append(f"dst_tp={self.dst_tp} not in 1..4")
        if not 0 <= self.restarts <= restarts:
            problems.append(f"restarts={self.restarts} not in 0..{restarts}")
        if self.restarts and "crash" not in self.fault_kinds:
            problems.append("restarts without the 'crash' fault kind")
        problems += layer_problems(self.layers, self.max_attempts)  # spec/stream
        if unknown := self.fault_kinds - FAULT_KINDS:
            problems.append(f"unknown fault kinds {sorted(unknown)}")
        if problems:
            raise ValueError(f"config {self.name!r}: " + "; ".join(problems))

    @property
    def chunk_mask_bits(self) -> int:
        return self.src_tp * self.blocks

    def initial(self) -> World:
        w = World(reqs=tuple(Req() for _ in range(self.n_reqs)), pfx=self.prefix > 0)
        return w._replace(hc=COMPLETE, hc_hl=self.blocks) if self.host_cache == 2 else w


_HANDOFF_FAULTS = frozenset({"lose", "duplicate", "corrupt", "mismatch"})
CONFIGS: dict[str, Config] = {
    c.name: c
    for c in (
        Config(
            name="handoff_tp2to1",
            doc="one request, 2 blocks, prefill TP=2 -> decode TP=1, one network fault",
            blocks=2,
            src_tp=2,
            dst_tp=1,
            cap_p=2,
            cap_d=2,
            faults=1,
            fault_kinds=_HANDOFF_FAULTS,
        ),
        Config(
            name="handoff_crash",
            doc="one request, 2 blocks, a worker may crash at any point (dst_tp=2 is for the"
            " data path: no spec action reads dst_tp, so the state space is that of TP 1->1)",
            blocks=2,
            src_tp=1,
            dst_tp=2,
            faults=1,
            fault_kinds=frozenset({"crash", "lose"}),
        ),
        Config(
            name="offload_contend",
            doc="two requests contend for a 3-block GPU: offload/reload, recompute, store failure",
            n_reqs=2,
            blocks=2,
            cap_p=3,
            cap_h=2,
            handoff=False,
            offload=True,
            recompute=True,
            faults=1,
            fault_kinds=frozenset({"store_fail"}),
            max_moves=2,
        ),
        Config(
            name="prefix_share",
            doc="two requests share a 1-block prefix on decode; zero-block handoffs; eviction",
            n_reqs=2,
            blocks=1,
            cap_p=2,
            cap_d=2,
            prefix=1,
            max_attempts=1,
        ),
        Config(
            name="handoff_two",
            doc="two requests hand off into a decode pool that fits one; lost messages",
            n_reqs=2,
            blocks=1,
            cap_p=2,
            cap_d=1,
            faults=1,
            fault_kinds=frozenset({"lose"}),
            max_attempts=1,
        ),
    )
}

NEW_WORLDS: tuple[Config, ...] = (  # worlds the first five lack (issue #11): where bugs show
    Config(
        name="prefix_partial_tp2",
        doc="a partial prefix hit (1 of 2 blocks) with prefill TP=2; one network fault",
        blocks=2,
        src_tp=2,
        cap_p=2,
        cap_d=2,
        prefix=1,
        faults=1,
        fault_kinds=frozenset({"lose", "duplicate", "corrupt"}),
        max_attempts=1,
    ),
    Config(
        name="prefix_partial_two",
        doc="two requests, partial prefix hits (1 of 2 blocks) into a decode pool that fits one",
        n_reqs=2,
        blocks=2,
        cap_p=4,
        cap_d=2,
        prefix=1,
        max_attempts=1,
    ),
    Config(
        name="prefix_crash",
        doc="two requests share a 1-block prefix on decode; decode (or prefill) may crash",
        n_reqs=2,
        blocks=1,
        cap_p=2,
        cap_d=2,
        prefix=1,
        faults=1,
        fault_kinds=frozenset({"crash"}),
        max_attempts=1,
    ),
    Config(
        name="offload_crash",
        doc="offload/reload and a handoff on one request; prefill (or decode) may crash",
        blocks=2,
        cap_p=2,
        cap_d=2,
        cap_h=2,
        offload=True,
        faults=1,
        fault_kinds=frozenset({"crash"}),
        max_attempts=1,
    ),
    Config(
        name="reject_retry",
        doc="two requests, a decode pool that fits one: rejections, retries, duplicated control",
        n_reqs=2,
        blocks=1,
        cap_p=2,
        cap_d=1,
        faults=1,
        fault_kinds=frozenset({"duplicate"}),
        max_attempts=2,
    ),
)
CONFIGS.update((c.name, c) for c in NEW_WORLDS)

BEHAVIOUR_WORLDS: tuple[Config, ...] = (  # the engine behaviours of issue #21 (spec/behaviours)
    Config(
        name="async_handoff",
        doc="one request, 1 block, async steps (dispatch, then complete) on both workers;"
        " handoff, cancel, recompute preemption",
        blocks=1,
        cap_p=1,
        cap_d=1,
        recompute=True,
        max_attempts=1,
        async_steps=True,
    ),
    Config(
        name="handoff_unrevocable",
        doc="one request, 2 blocks, a transport with no revoke (one-sided RDMA writes, a"
        " NIXL/Mooncake batch): decode cannot fence; one lost or corrupt message",
        blocks=2,
        cap_p=2,
        cap_d=2,
        faults=1,
        fault_kinds=frozenset({"lose", "corrupt"}),
        revocable=False,
    ),
    Config(
        name="handoff_decode_fail",
        doc="one request, 2 blocks: decode may fail an attempt on its own error; one corrupt chunk",
        blocks=2,
        cap_p=2,
        cap_d=2,
        faults=1,
        fault_kinds=frozenset({"corrupt"}),
        decode_failure=True,
    ),
    Config(
        name="handoff_retract",
        doc="one request; decode may retract its committed copy (refetch: recompute on"
        " prefill, a second handoff); one duplicated control message",
        blocks=1,
        cap_p=1,
        cap_d=1,
        faults=1,
        fault_kinds=frozenset({"duplicate"}),
        max_attempts=2,
        retract=True,
    ),
    Config(
        name="handoff_tp1to2",
        doc="one request, 2 blocks, prefill TP=1 -> decode TP=2: each decode rank installs"
        " its shard before decode commits; one lost message",
        blocks=2,
        src_tp=1,
        dst_tp=2,
        faults=1,
        fault_kinds=frozenset({"lose"}),
        decode_ranks=True,
    ),
)
CONFIGS.update((c.name, c) for c in BEHAVIOUR_WORLDS)

CRASH_WORLDS: tuple[Config, ...] = (  # restarts, and a crash of each worker (issue #21 item 4)
    Config(
        name="restart_handoff",
        doc="one request, 1 block, a worker may crash once and come back as a new incarnation",
        blocks=1,
        cap_p=1,
        cap_d=1,
        faults=1,
        fault_kinds=frozenset({"crash"}),
        max_attempts=1,
        restarts=1,
    ),
    Config(
        name="crash_both",
        doc="one request, 2 blocks, both workers may crash (fault budget 2): decode's crash"
        " after prefill's reaches a running request whose only complete copy was on decode",
        blocks=2,
        faults=2,
        fault_kinds=frozenset({"crash"}),
        max_attempts=1,
    ),
)
CONFIGS.update((c.name, c) for c in CRASH_WORLDS)

BEHAVIOUR_WORLDS += (  # content identity and metadata slots (behaviours/identity, slots)
    Config(
        name="identity_prefix",
        doc="one request, 2 blocks, a 1-block cached prefix on decode that may be recycled"
        " under a lagging index; the sender stages blocks before it sends them",
        blocks=2,
        cap_p=2,
        cap_d=3,
        prefix=1,
        identity=True,
        max_attempts=1,
    ),
    Config(
        name="slots_two",
        doc="two requests, 1 block each, one metadata slot on decode reused across them",
        n_reqs=2,
        blocks=1,
        cap_p=2,
        cap_d=2,
        slots=True,
        max_attempts=1,
    ),
)
CONFIGS.update((c.name, c) for c in (*BEHAVIOUR_WORLDS, *TW.worlds(Config)))
FAULT_KINDS |= HC_FAULTS  # issue #22 items 1-3: the shared host cache's worlds
CONFIGS.update((k["name"], Config(**k)) for k in (*HC_WORLDS, *STREAM_WORLDS))
CONFIGS.update((k, replace(CONFIGS[b], name=k, **v)) for k, (b, v) in DERIVED.items())
CONFIGS.update((k, Config(name=k, **v)) for k, v in (COMPOSED | WINDOW).items())  # composed
# The default suite: small, focused worlds (``kvown check``, about a minute on 2 cores).
DEFAULT_SUITE: tuple[str, ...] = (
    "handoff_tp2to1",
    "handoff_crash",
    "offload_contend",
    "offload_crash",  # a reload that fills the pool exactly (PrefillReloadBegin's bound)
    "prefix_share",
    "handoff_two",
    "async_handoff",
    "handoff_unrevocable",
    "handoff_decode_fail",
    "handoff_retract",
    "handoff_tp1to2",
    "restart_handoff",
    "crash_both",
    "identity_prefix",
    *TW.DEFAULT + DERIVED_DEFAULT,
    *HC_DEFAULT + STREAM_DEFAULT + tuple(WINDOW),
)
# The deep suite: the larger worlds (``kvown check --suite deep``; CI runs it nightly);
TOO_BIG: frozenset[str] = frozenset({"reject_retry"})  # its small variants: behaviours/worlds
DEEP_SUITE: tuple[str, ...] = tuple(
    c.name for c in NEW_WORLDS if c.name not in TOO_BIG and c.name not in DEFAULT_SUITE
)
DEEP_SUITE += ("slots_two", *DERIVED_DEEP, *TW.DEEP, *HC_DEEP, *COMPOSED, *STREAM_DEEP)
SUITES: dict[str, tuple[str, ...]] = {"default": DEFAULT_SUITE, "deep": DEEP_SUITE}
# Bigger instances: the scale curve and a world to check on its own.
SCALE: dict[str, Config] = {
    f"scale_{k}": Config(
        name=f"scale_{k}",
        doc=f"{k} requests, 1 block each, handoff; no cancel, no faults",
        n_reqs=k,
        blocks=1,
        cap_p=k,
        cap_d=k,
        cancel=False,
        max_attempts=1,
    )
    for k in (1, 2, 3, 4)
}
SCALE["handoff_three_tp2to1"] = Config(
    name="handoff_three_tp2to1",
    doc="3 requests, 1 block each, TP=2 -> TP=1; prefill fits 2, decode 1; no cancel, no faults",
    n_reqs=3,
    blocks=1,
    src_tp=2,
    dst_tp=1,
    cap_p=2,
    cap_d=1,
    cancel=False,
    max_attempts=1,
)

# One request of a `kvown cluster` run (refimpl/cluster/eventlog.py checks its merged log).
CLUSTER: dict[str, Config] = {
    f"cluster_tp{t}_b{b}": Config(
        name=f"cluster_tp{t}_b{b}",
        doc=f"one request of a cluster run: {b} blocks, prefill TP={t} -> decode TP=1",
        blocks=b,
        src_tp=t,
        dst_tp=1,
        cap_p=b,
        cap_d=b,
        faults=2,
        fault_kinds=frozenset({"crash", "lose"}),
    )
    for t in (1, 2, 3, 4)
    for b in (1, 2, 3)
}


def get_config(name: str) -> Config:
    for table in (CONFIGS, SCALE, CLUSTER):
        if name in table:
            return table[name]
    valid = ", ".join([*CONFIGS, *SCALE, "cluster_tp{1..4}_b{1..3}"])
    raise KeyError(f"unknown config {name!r}; valid configs: {valid}")
