"""The fields an instance is split on so that its message codes are concrete
(``model_checks.symbolic.finite``): derived from the action's traced message operations,
checked against the hand-written ``PIN_FIELDS`` in every world the encoding takes."""

from __future__ import annotations

from collections.abc import Callable

from model_checks.symbolic.actions import encodable
from model_checks.symbolic.encoding import Encoding
from model_checks.symbolic.finite import PIN_FIELDS, pin_fields
from spec.config import CONFIGS, Config

# Reviewed: where the derived split needs fewer fields than the hand table's, which
# splits every world alike. DecodeReserve's Ready carries the prefix hit, decided on
# ``pfx``: the tracer forks on it, so each path's code is concrete already. PrefillResume
# takes the Nack it was given and sends a code of its own (Quiesced) only where writes
# cannot be revoked. PrefillFreeze and DecodeAbortFenced send nothing in the worlds where
# they are never enabled (no handoff; no revocable writes).
FEWER: dict[str, Callable[[Config], bool]] = {
    "DecodeReserve": lambda c: True,
    "PrefillResume": lambda c: c.revocable,
    "PrefillFreeze": lambda c: not c.handoff,
    "DecodeAbortFenced": lambda c: not c.revocable,
}


def test_derived_pin_fields_equal_the_hand_table_but_for_the_reviewed_worlds() -> None:
    diff: list[tuple[str, str, tuple[str, ...], tuple[str, ...]]] = []
    for c in CONFIGS.values():
        if not encodable(c):
            continue
        enc = Encoding(c, instances=False)
        for k in enc._all_instances():
            hand = PIN_FIELDS.get(k.name, ())
            expect = () if k.name in FEWER and FEWER[k.name](c) else hand
            got = pin_fields(enc, enc.tmpl, k)
            if got != expect:
                diff.append((c.name, k.name, expect, got))
    assert diff == []
