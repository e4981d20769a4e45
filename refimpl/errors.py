"""Typed refusals of the reference implementation.

Every refused command raises a subclass of :class:`OwnershipError` and changes nothing.
Each error names, in ``prop``, the property ID it would have broken had it gone ahead, so
a failure reads like the spec: ``CapacityError(prop='CapacityRefcount'): ...``.

The property IDs are the spec's. Until ``spec/`` exports them, they are listed here as
plain strings (``PROPERTY_IDS``); the names must stay verbatim.

``ManifestError`` is special: ``spec/manifest.py`` must not import ``refimpl``, so the spec
defines its own pure ``spec.manifest.ManifestError(ValueError)``. The one here subclasses
both that and :class:`OwnershipError`, so ``except spec.manifest.ManifestError`` catches
either, and ``ManifestError.from_spec(err)`` lifts a spec error into the refimpl family.
"""

from __future__ import annotations

from spec.manifest import ManifestError as SpecManifestError

PROPERTY_IDS: tuple[str, ...] = (
    "SingleWriter",
    "NoPartialUse",
    "NothingLost",
    "FrozenSnapshot",
    "Fencing",
    "NoReuseUnderIO",
    "StickyEnd",
    "ManifestGate",
    "CapacityRefcount",
    "RankAgreement",
    "PublishAfterCommit",
    "LoadXorStore",
    "ContentIdentity",
)


class OwnershipError(Exception):
    """A refused action. ``prop`` is the property ID the action would have broken."""

    prop: str = ""

    def __init__(self, message: str, *, prop: str | None = None) -> None:
        if prop is not None:
            self.prop = prop
        if self.prop not in PROPERTY_IDS:
            raise ValueError(f"unknown property ID {self.prop!r}")
        super().__init__(message)

    def __str__(self) -> str:
        return f"[{self.prop}] {super().__str__()}"


class ManifestError(OwnershipError, SpecManifestError):
    """An untrusted or incompatible manifest. ``reasons`` lists every problem found."""

    prop = "ManifestGate"

    def __init__(self, reasons: list[str]) -> None:
        SpecManifestError.__init__(self, reasons)  # sets .reasons and the message

    @classmethod
    def from_spec(cls, err: SpecManifestError) -> ManifestError:
        return err if isinstance(err, cls) else cls(list(err.reasons))


class CapacityError(OwnershipError):
    """Not enough free blocks; nothing was allocated."""

    prop = "CapacityRefcount"


class RefcountError(OwnershipError):
    """A reference that is not held was dropped, or a count would go negative."""

    prop = "CapacityRefcount"


class IntegrityError(OwnershipError):
    """``check_integrity()`` found the conservation law broken (a bug, not a refusal)."""

    prop = "CapacityRefcount"


class InUseError(OwnershipError):
    """A block is the source or destination of a transfer that has not ended."""

    prop = "NoReuseUnderIO"


class FrozenError(OwnershipError):
    """A write to a block that is pinned by a snapshot or shared with another holder."""

    prop = "FrozenSnapshot"


class OwnerError(OwnershipError):
    """The caller is not the block's one writer."""

    prop = "SingleWriter"


class ChunkError(OwnershipError):
    """A chunk that cannot be installed as is: wrong size, index or header."""

    prop = "NoPartialUse"


class ChecksumError(ChunkError):
    """The bytes delivered are not the bytes advertised; nothing was installed."""


class IncompleteError(OwnershipError):
    """Commit or use of a replica that has not received every block."""

    prop = "NoPartialUse"


class StaleError(OwnershipError):
    """A message from another attempt (epoch) or request; it changes nothing."""

    prop = "Fencing"


class CancelledError(OwnershipError):
    """The request reached a sticky end (cancelled or failed); no install after it."""

    prop = "StickyEnd"


class DecodeFailedError(CancelledError):
    """The decode side failed the attempt itself (``Receiver.fail``, the spec's
    ``DecodeFail``): never validated, committed or stepped; the sender may retry."""


class IdentityError(OwnershipError):
    """A block whose content is not the one its hash names: never staged, or foreign."""

    prop = "ContentIdentity"


class MissError(OwnershipError):
    """A tier holds no whole, matching copy (absent, torn, truncated, corrupt or another
    model's): a miss, never a hit; the caller recomputes. Nothing was allocated."""

    prop = "NoPartialUse"
