"""The nightly job's record in benchmarks/RESULTS.md: one line, written by
``.ci/nightly --record`` and read by tests/architecture/test_nightly_job.py.

    nightly-record: DATE COMMIT RESULT | SUMMARY

DATE is UTC (``2026-12-02T02:50Z``), COMMIT the 40-hex commit the job ran on, RESULT
``pass``, ``FAIL`` or ``partial`` (steps not run to their end, written by hand with the
reason in SUMMARY), SUMMARY the job's one summary line.

    python .ci/nightly_record.py rate FILE            kill summary of a mutate --json output
    python .ci/nightly_record.py write RESULTS COMMIT RESULT LINE   replace the record
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import NamedTuple

PREFIX = "nightly-record: "
LINE = re.compile(
    r"^nightly-record: (\d{4}-\d\d-\d\dT\d\d:\d\dZ) ([0-9a-f]{40}) (pass|FAIL|partial) \| (.+)$",
    re.M,
)


class Record(NamedTuple):
    date: str
    commit: str
    result: str
    summary: str


def parse(text: str) -> Record:
    """The one record of ``text``; ValueError naming what is wrong otherwise."""
    found = LINE.findall(text)
    if len(found) != 1:
        raise ValueError(
            f"expected one '{PREFIX}DATE COMMIT RESULT | SUMMARY' line, got {len(found)}"
        )
    return Record(*found[0])


def write(results: Path, commit: str, result: str, summary: str) -> Record:
    """Replace the record in ``results`` (it must hold exactly one) with today's."""
    rec = Record(time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), commit, result, summary)
    line = f"{PREFIX}{rec.date} {rec.commit} {rec.result} | {rec.summary}"
    text = results.read_text(encoding="utf-8")
    parse(text)  # exactly one, well formed
    new = LINE.sub(line.replace("\\", "\\\\"), text)
    if parse(new) != rec:
        raise ValueError(f"the record would not read back: {line!r}")
    results.write_text(new, encoding="utf-8")
    return rec


def rate(out: Path) -> str:
    """'killed K of N (kill rate R)' from ``kvown mutate --json``'s output. The two targets'
    reports differ (``not_covered`` is a count for spec, a list for refimpl): only the keys
    both have are read, and the rate is the report's own."""
    text = out.read_text(encoding="utf-8", errors="replace")
    start = text.find("{")
    try:
        report = json.loads(text[start:]) if start >= 0 else None
    except ValueError:
        report = None
    if not isinstance(report, dict) or not {"killed", "mutants", "kill_rate"} <= report.keys():
        return "(no report)"
    return f"killed {report['killed']} of {report['mutants']} (kill rate {report['kill_rate']})"


def main(argv: list[str]) -> int:
    if argv[:1] == ["rate"] and len(argv) == 2:
        print(rate(Path(argv[1])))
        return 0
    if argv[:1] == ["write"] and len(argv) == 5:
        print(write(Path(argv[1]), argv[2], argv[3], argv[4]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
