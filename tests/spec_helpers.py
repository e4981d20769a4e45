"""Hand-made states for the spec tests."""

from __future__ import annotations

from spec.state import Req, World


def W(*reqs: Req, **globals_: object) -> World:  # noqa: N802 - reads like a constructor
    return World(reqs=tuple(reqs), **globals_)  # type: ignore[arg-type]


def R(**fields: object) -> Req:  # noqa: N802
    return Req(**fields)  # type: ignore[arg-type]
