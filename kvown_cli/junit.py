"""JUnit XML for CI systems: ``--junit FILE`` on ``check``, ``check-trace``, ``fuzz`` and
``prove``.

One ``<testcase>`` per property x config (check), per log (check-trace), per mutant or
config (fuzz) and per claim (prove). A failing case carries a ``<failure>`` whose text is
the counterexample as the terminal shows it. Written with ``xml.etree`` (escaping is the
library's), to a temporary file renamed into place, so a reader never sees half a file.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from kvown_cli import usage as outcome

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


@dataclass(frozen=True)
class Case:
    """One JUnit testcase."""

    classname: str  # e.g. "kvown.check.handoff_tp2to1"
    name: str  # e.g. the property ID
    seconds: float = 0.0
    failure: str | None = None  # the counterexample text; None when it passed
    message: str = ""  # one line: what failed
    skipped: str | None = None  # why it was not applicable


def _text(s: str) -> str:
    """XML 1.0 cannot hold control characters; show them escaped."""
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", s)


def to_xml(suite: str, cases: list[Case]) -> ET.ElementTree[ET.Element]:
    failures = sum(1 for c in cases if c.failure is not None)
    skipped = sum(1 for c in cases if c.skipped is not None and c.failure is None)
    total = sum(c.seconds for c in cases)
    root = ET.Element("testsuites", name="kvown")
    ts = ET.SubElement(
        root,
        "testsuite",
        name=suite,
        tests=str(len(cases)),
        failures=str(failures),
        errors="0",
        skipped=str(skipped),
        time=f"{total:.3f}",
    )
    for c in cases:
        tc = ET.SubElement(
            ts,
            "testcase",
            classname=_text(c.classname),
            name=_text(c.name),
            time=f"{c.seconds:.3f}",
        )
        if c.failure is not None:
            f = ET.SubElement(tc, "failure", message=_text(c.message or "failed"), type="violation")
            f.text = _text(c.failure)
        elif c.skipped is not None:
            ET.SubElement(tc, "skipped", message=_text(c.skipped))
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(path: str, suite: str, cases: list[Case]) -> None:
    """Write the suite to ``path`` atomically (a temporary file beside it, then rename);
    a path that exists and is not a regular file (a pipe, /dev/stdout) is written in place.
    A failure is reported and noted (``outcome``): the command's verdict still stands."""
    try:
        if os.path.exists(path) and not os.path.isfile(path):
            to_xml(suite, cases).write(path, encoding="utf-8", xml_declaration=True)
            return
        tmp = f"{path}.tmp{os.getpid()}"
        try:
            to_xml(suite, cases).write(tmp, encoding="utf-8", xml_declaration=True)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as exc:  # after the work: reported, and the verdict's code stands
        outcome.output_failed(path, exc)
