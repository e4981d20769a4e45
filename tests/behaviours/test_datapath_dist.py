"""A TP 2 -> TP 1 handoff with one OS process per rank over torch.distributed (gloo),
layer by layer, through the public API only (examples/dist_layer_handoff.py): the decode
side's tokens and logits equal one unbroken process's run, every layer is seen ready
before the commit, and every process ends (by its pid, after a bounded wait)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from refimpl.api import channels
from refimpl.transport_dist import handoff_route

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dist_layer_handoff.py"


def test_handoff_route_sends_each_channel_to_its_process() -> None:
    route, ch = handoff_route(5, [3, 4]), channels("r")
    assert [route(ch.to_receiver), route(ch.to_sender), route(ch.to_rank(1))] == [5, 3, 4]
    with pytest.raises(ValueError, match="not a handoff channel of 2 ranks"):
        route(ch.to_rank(2))


def test_tp2_to_tp1_one_process_per_rank_layer_by_layer() -> None:
    spec = importlib.util.spec_from_file_location("dist_layer_handoff", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["dist_layer_handoff"] = mod
    spec.loader.exec_module(mod)
    reports = {r["role"]: r for r in mod.launch(timeout_s=90.0)}
    assert sorted(reports) == ["decode", "prefill0", "prefill1"]
    dec = reports["decode"]
    assert dec["state"] == "done" and dec["tokens_equal"] and dec["logits_equal"]
    assert [layer for layer, _ in dec["layers_seen"]] == [0, 1, 2]
    assert dec["checks"] == 2 * 3 + 2 * 3  # a chunk per (rank, layer), a seal per (rank, block)
    assert all(reports[f"prefill{r}"] == {"role": f"prefill{r}", "state": "done", "held": 0}
               for r in range(2))  # fmt: skip
