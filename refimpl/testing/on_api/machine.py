"""The Hypothesis machine on the public API (issue #30 item 4): ``refimpl.testing.machine``'s
random walks with faults, driving real Senders/Receiver through ``adapter.ApiAdapter``.

``make_api_machine`` subclasses the machine's ``SpecMachine`` and changes only what the
API needs: the oracle is the spec closed under the API's eager steps (``tour.ApiHarness``);
the refusals offered are the ones the API can judge (``tour.api_probes``: a message not in
flight, ``tour.judged``), for the rules, the probes and the invariants alike; the drain
takes the closure. A divergence of a class ``gaps.GAPS`` names ends its example (counted
in ``ApiTally.gaps``: the walk cannot go on past a known gap); any other fails the test.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from refimpl.testing.drain import drain
from refimpl.testing.harness import Coverage, Divergence
from refimpl.testing.machine import Cand, SpecMachine, Tally
from refimpl.testing.on_api.gaps import GAPS
from refimpl.testing.on_api.tour import ApiHarness, close, declined, gap_of, judged
from refimpl.testing.probes import MSG_ACTIONS
from refimpl.testing.tempo import tempos
from spec.actions import decode_args
from spec.config import Config

__all__ = ["ApiTally", "make_api_machine"]


@dataclass
class ApiTally(Tally):
    gaps: Counter[str] = field(default_factory=Counter)  # examples ended at a known gap


def _judged(
    name: str, args: dict[str, Any], net: Callable[[int], tuple[int, ...]], c: Config
) -> bool:
    if name in MSG_ACTIONS:
        i, code = decode_args(name, args)
        return code not in net(i)
    return judged(name, c)


class ApiMachine(SpecMachine):
    """``SpecMachine`` on the API (see the module doc)."""

    tally: ClassVar[Any]

    def __init__(self) -> None:
        super().__init__()
        self.gapped = False

    def _guard(self, fn: Callable[[], object]) -> Any:
        if self.gapped:
            return None
        try:
            return fn()
        except Divergence as err:
            if gap_of(err) in GAPS:  # a known gap: this example ends here
                self.tally.gaps[gap_of(err)] += 1
                self.gapped = self.failed = True
                return None
            self.tally.failed(err)
            self.failed = True
            raise

    def menu(self, name: str) -> tuple[list[Cand], list[Cand], list[Cand]]:
        enabled, named, dull = super().menu(name)
        h = self.harness
        enabled = [c for c in enabled if not declined(h.w, h.c, name, *decode_args(name, c[0]))]
        net = h.w.reqs
        keep = [c for c in named if _judged(name, c[0], lambda i: net[i].net, h.c)]
        return enabled, keep, [c for c in dull if _judged(name, c[0], lambda i: net[i].net, h.c)]

    def eligible(self, name: str) -> bool:
        return not self.gapped and super().eligible(name)

    @initialize(seed=st.integers(0, 2**16 - 1), data=st.data())
    def build(self, seed: int, data: st.DataObject) -> None:
        self.tempo = data.draw(tempos(self.config), label="tempo")
        torch.manual_seed(seed)
        self.h = self._guard(
            lambda: ApiHarness(self.adapter, self.config, self.mutants, seed, self.coverage)
        )
        self._guard(self.harness.check_state)
        note(f"  0 init seed={seed} {self.config.name} (refimpl.api)")

    def arbitrary_step(self, data: st.DataObject) -> None:  # not a rule here (see menu)
        raise AssertionError("the API machine draws only the refusals it can judge")

    @precondition(lambda self: self.gapped or not self._any_eligible())
    @rule()
    def rest(self) -> None:
        """Nothing to take (a known gap ended the example, or all is quiet): wait."""

    @invariant()
    def refusals_agree(self) -> None:  # the probes the API judges, as the tour's
        from refimpl.testing.on_api.tour import api_probes

        if not self.gapped:
            self._guard(lambda: self.harness.probe_all(api_probes(self.harness)[0]))

    @invariant()
    def guards_agree(self) -> None:
        if not self.gapped:
            super().guards_agree()

    def teardown(self) -> None:
        if self.h is not None and not self.failed:
            c = self.config
            self._guard(
                lambda: drain(
                    self.harness,
                    lambda w: close(w, c),
                    lambda w, n, i, a: declined(w, c, n, i, a),
                )
            )


def make_api_machine(
    adapter: Any,
    config: Config,
    mutants: Sequence[str] = (),
    *,
    coverage: Coverage | None = None,
    tally: ApiTally | None = None,
) -> type[ApiMachine]:
    """A machine class for the API on ``config`` (``machine.make_machine``'s shape)."""
    unknown = set(mutants) - set(adapter.switches())
    if unknown:
        raise ValueError(f"unknown switches {sorted(unknown)}; known: {sorted(adapter.switches())}")
    suffix = "".join(part.title() for part in config.name.split("_"))
    attrs = {
        "adapter": adapter,
        "config": config,
        "mutants": frozenset(mutants),
        "tally": tally if tally is not None else ApiTally(),
        "coverage": coverage,
        "__module__": __name__,
    }
    return type(f"Api{suffix}", (ApiMachine,), attrs)
