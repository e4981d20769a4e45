"""What real engines do beyond the core handoff, one behaviour per module.

Each module here adds one class of engine behaviour to the one vocabulary (its Req/World
fields, its actions with their guards, the property that protects it), gated by a
``Config`` switch so that the worlds which do not enable it keep their pinned outcomes.
The core modules of ``spec/`` register what these modules define.
"""

__all__ = [
    "async_steps",
    "decode_failure",
    "identity",
    "irrevocable",
    "decode_ranks",
    "restarts",
    "retract",
    "slots",
    "turns",
    "turn_worlds",
    "worlds",
]
