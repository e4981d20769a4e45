"""A reload copy on the critical stream blocks decode (seed failure 6).

Request r0 was offloaded to pinned host memory and is now reloaded, one block per copy,
while the GPU keeps decoding other requests. The bug: the reload's host-to-device copy
is issued on the compute stream, the one decode kernels run on. A decode step enqueued
while the copy runs now waits for the whole copy (milliseconds for a 256 MiB block),
although it reads none of those blocks. The bytes are right either way: this is a
latency failure, below what the spec models (it has no streams), so no spec property
and no mutant of the model check cover it; the engine's switch is
``reload_on_critical_stream``.

The correct engine copies on a separate transfer stream: a decode step enqueued during
the copy starts at once. Measured with CUDA events: is the decode step's start ordered
after the copy's end? On CPU there are no streams: the check is not applicable.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
from refimpl.engine import STREAM_SWITCH, Engine  # noqa: E402
from refimpl.replay import Out, Repro, Result, step  # noqa: E402
from repro._script import script_main  # noqa: E402
from spec.config import get_config  # noqa: E402

PROPERTY = "none (CUDA stream)"
MUTANT = None
COVERS = ("seed 6: a reload copy on the critical stream blocks decode",)
SCENARIO = "r0's reload copy runs on the compute stream; a decode step waits for it (CUDA)"
BEFORE_RELOAD = (
    "PrefillAdmit",
    "PrefillRun",
    "PrefillOffloadBegin",
    "PrefillOffloadCopy",
    "PrefillOffloadCopy",
    "PrefillOffloadCommit",
    "PrefillReloadBegin",
)
LAYERS, HEADS, BLOCK, DIM = 16, 8, 4096, 128  # fp16: 256 MiB a block


def decode_waits(e: Engine) -> tuple[bool, float]:
    """Reload one block in a worker thread (as a transfer thread would); as soon as the
    copy is on the GPU, enqueue a decode step (a GEMM) on the compute stream. Returns
    (the decode step started only after the copy ended, ms from copy end to that start)."""
    compute = torch.cuda.current_stream()
    transfer = e.P.pools[0].copy_stream
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    worker = threading.Thread(target=e.step, args=("PrefillReloadCopy", {"req": 0}))
    worker.start()
    busy = None
    deadline = time.perf_counter() + 10.0
    while busy is None and time.perf_counter() < deadline:
        time.sleep(0)  # let the worker take the GIL to enqueue its copy
        busy = next((s for s in (compute, transfer) if s is not None and not s.query()), None)
    if busy is None:
        worker.join()
        raise RuntimeError("the reload copy ended before it could be observed")
    copy_end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    copy_end.record(busy)  # fires when the work queued on the busy stream (the copy) ends
    start.record(compute)
    y = x @ x  # the decode step of another request
    worker.join()
    torch.cuda.synchronize()
    del y
    gap = copy_end.elapsed_time(start)  # > 0: the decode step started after the copy
    return gap >= 0, gap


def measure(r: Repro, bug: bool) -> tuple[bool, float]:
    e = Engine(
        get_config("offload_contend"),
        mutants=frozenset({STREAM_SWITCH} if bug else ()),
        layers=LAYERS,
        kv_heads=HEADS,
        block_size=BLOCK,
        head_dim=DIM,
    )
    for a in BEFORE_RELOAD:
        e.step(a, {"req": 0})
    waited, gap = decode_waits(e)
    r.run_steps(e, [step("PrefillReloadCopy", req=0), step("PrefillReloadCommit", req=0)])
    r.expect(e.damaged() == [], "the reloaded bytes equal the truth")
    return waited, gap


def run(out: Out | None = print) -> Result:
    r = Repro(Path(__file__).stem, PROPERTY, MUTANT, out)
    r.say(__doc__ or "")
    if not torch.cuda.is_available():
        e = Engine(get_config("offload_contend"), mutants=frozenset({STREAM_SWITCH}))
        r.config = e.config
        r.run_steps(e, [step(a, req=0) for a in (*BEFORE_RELOAD, "PrefillReloadCopy")])
        r.expect(not e.stream_switch_applicable, "the switch has no meaning without CUDA streams")
        r.expect(e.damaged() == [], "with the switch on, the CPU reload is byte-exact")
        r.say("not applicable: this failure needs CUDA streams; on CPU it is skipped")
        r.damage = r.prevented = "n/a on CPU"
        return r.result()
    r.config = get_config("offload_contend")
    r.say(f"with the bug ({STREAM_SWITCH}), 256 MiB blocks on {torch.cuda.get_device_name()}:")
    waited, gap = measure(r, bug=True)
    r.expect(waited, f"the decode step starts {gap:.3f} ms after the copy's end: it waited")
    r.damage = f"a decode step enqueued during the reload starts only after the copy ({gap:.3f} ms)"
    r.say("without the bug (reload on the transfer stream):")
    waited, gap2 = measure(r, bug=False)
    r.expect(not waited, f"the decode step starts {-gap2:.3f} ms before the copy ends")
    r.prevented = (
        f"on the transfer stream the decode step starts {-gap2:.3f} ms before the copy ends"
    )
    return r.result()


def main() -> int:
    return script_main(run)


if __name__ == "__main__":
    raise SystemExit(main())
