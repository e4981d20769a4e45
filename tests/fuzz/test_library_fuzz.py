"""The library fuzz machine (``refimpl.testing.library``) under the loaded profile: random
geometries and meshes, faults, cancels and crashes; every example drains to quiescence
and ends with no block held on either side."""

from __future__ import annotations

from hypothesis.stateful import get_state_machine_test

from refimpl.testing.library import LibraryMachine
from refimpl.testing.run import machine_settings

test_the_library_paths_drain_with_nothing_held = get_state_machine_test(
    LibraryMachine, settings=machine_settings(max_examples=50, stateful_step_count=25)
)
