"""The README's library example runs as printed (its last line asserts the handoff), and
so do the receive and send loops of the ``Receiver`` and ``Sender`` docstrings, each with
its peer in another "process" (advanced only while this side polls): the receive loop
starts before the manifest has arrived, the normal case across processes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

import refimpl.api.receiver
import refimpl.api.sender
from refimpl import Receiver, Sender, State, read_kv
from refimpl.transport import InProcessTransport, Message
from tests.library.lib_helpers import MODEL, geo, pair, prefill

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_library_example_runs() -> None:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## As a library") :]
    code = section[section.index("```python\n") + 10 : section.index("```\n", 10)]
    assert "handoff(" in code and "assert " in code
    exec(compile(code, "README.md", "exec"), {})


def _snippet(module: ModuleType) -> str:
    """The indented code block at the top of a module's docstring, dedented."""
    lines = (module.__doc__ or "").splitlines()[2:]
    block = [x[4:] for x in lines[: lines.index("")]]
    assert block and all(x.strip() for x in block), block
    return "\n".join(block)


class _ThisSide:
    """This process's view of the transport: each poll first lets the peer's process run
    one step (``step(n)`` at this side's n-th poll)."""

    def __init__(self, shared: InProcessTransport, step: Callable[[int], None]) -> None:
        self.shared, self.step, self.polls = shared, step, 0

    def send(self, channel: str, header: Any, payload: Any = b"") -> None:
        self.shared.send(channel, header, payload)

    def poll(self, channel: str) -> list[Message]:
        self.polls += 1
        self.step(self.polls)
        return self.shared.poll(channel)

    def abort(self, channel: str) -> int:
        return self.shared.abort(channel)


def test_the_receiver_docstring_loop_runs_across_processes() -> None:
    p = pair(geo(), geo(), dst_cap=64)
    kv = prefill(p, "req-1", 10)

    def sender_process(n: int) -> None:
        if n == 2:  # the manifest is sent only after the receiver's first poll
            p.tx.offer("req-1", list(range(10)))
        p.tx.poll("req-1")

    ns = {"Receiver": Receiver, "pools": p.dst, "geometry": p.rx.geometry, "model": MODEL}
    ns["transport"] = _ThisSide(p.t, sender_process)
    exec(compile(_snippet(refimpl.api.receiver), "receiver.py", "exec"), ns)
    got = ns["got"]
    assert ns["rx"].state("req-1") is State.DONE and ns["transport"].polls == 3
    assert torch.equal(read_kv(p.dst, got.blocks, 10), kv)
    assert len(got.blocks) == p.rx.geometry.blocks_for(10 + 64)


def test_the_sender_docstring_loop_runs_across_processes() -> None:
    p = pair(geo(), geo())
    kv = prefill(p, "req-1", 10)
    ns = {"Sender": Sender, "pools": p.src, "geometry": p.tx.geometry, "model": MODEL}
    ns["transport"] = _ThisSide(p.t, lambda _: p.rx.poll("req-1"))  # the receiver's process
    ns["token_ids"], ns["the_blocks_to_send"] = list(range(10)), p.src.alloc.blocks_of("req-1")
    exec(compile(_snippet(refimpl.api.sender), "sender.py", "exec"), ns)
    assert ns["tx"].state("req-1") is State.DONE and ns["m"].num_tokens == 10
    assert torch.equal(read_kv(p.dst, p.rx.result("req-1").blocks, 10), kv)
