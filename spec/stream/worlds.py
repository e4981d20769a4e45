"""The streamed worlds (``spec/stream/layers.py``), as ``Config`` keyword sets."""

from __future__ import annotations

from typing import Any


def layer_problems(layers: int, max_attempts: int) -> list[str]:
    """``Config`` checks of ``layers``: 0..3, and one attempt when on (the layer
    registers are the attempt's, never reset)."""
    if not 0 <= layers <= 3 or (layers and max_attempts != 1):
        return [f"layers={layers} not in 0..3 (with max_attempts=1)"]
    return []


STREAM_WORLDS: tuple[dict[str, Any], ...] = (
    {
        "name": "stream_one",
        "doc": "one request, 1 block, 2 layers streamed (send_layer each, then the chunk);"
        " the source may be freed once every layer was given; decode stages, installs"
        " and reports each layer",
        "blocks": 1,
        "cap_p": 1,
        "cap_d": 1,
        "max_attempts": 1,
        "layers": 2,
    },
    {
        "name": "stream_reuse",
        "doc": "two requests, 1 block each, 1 layer streamed, a prefill pool of one block:"
        " the second request reuses the first's freed source blocks during its handoff",
        "n_reqs": 2,
        "blocks": 1,
        "cap_p": 1,
        "cap_d": 2,
        "max_attempts": 1,
        "cancel": False,
        "layers": 1,
    },
)
STREAM_DEFAULT: tuple[str, ...] = ("stream_one",)  # the default suite (pinned)
STREAM_DEEP: tuple[str, ...] = ("stream_reuse",)  # 52,854 states: the deep suite
