"""The exit-code contract of every command (README: 0 holds, 1 violation, 2 bad input,
3 internal error, 130 Ctrl-C) and ``--junit``: XML a JUnit parser reads, one testcase
per property x config / log / claim / switch, failures carrying the terminal's text."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvown_cli.main import main
from spec.config import get_config
from spec.invariants import for_config
from spec.properties import PROPERTIES

ROOT = Path(__file__).resolve().parents[3]
TRACES = ROOT / "repro" / "traces"


def kvown(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def cases(path: Path) -> list[ET.Element]:
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    got = suite.findall("testcase")
    assert int(suite.get("tests", "-1")) == len(got)
    assert int(suite.get("failures", "-1")) == sum(1 for c in got if c.find("failure") is not None)
    return got


def test_check_junit_has_a_testcase_per_property_and_config(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "check.xml"
    rc, _, _ = kvown(capsys, "check", "--config", "offload_contend", "--junit", str(out))
    assert rc == 0
    got = cases(out)
    claimed = [n for n, _ in for_config(get_config("offload_contend"))]  # INVARIANTS.md
    assert sorted(c.get("name", "") for c in got) == sorted([*PROPERTIES, *claimed])
    assert {c.get("classname") for c in got} == {"kvown.check.offload_contend"}
    assert all(c.find("failure") is None for c in got)


def test_check_mutant_junit_carries_the_terminal_counterexample(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "mutant.xml"
    rc, shown, _ = kvown(capsys, "check", "--mutant", "failed_store_visible", "--junit", str(out))
    assert rc == 1
    (case,) = cases(out)
    failure = case.find("failure")
    assert failure is not None and failure.text
    assert "PublishAfterCommit" in failure.get("message", "")
    words = " ".join  # the terminal wraps long lines at its width
    assert words(failure.text.split()) in words(shown.split())  # the text the terminal shows


def test_check_trace_junit_one_testcase_per_log(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ok, bad = TRACES / "ok_handoff.jsonl", TRACES / "incident1_vllm_32255.jsonl"
    rc, _, _ = kvown(capsys, "check-trace", str(ok), "--junit", str(tmp_path / "ok.xml"))
    assert rc == 0
    (case,) = cases(tmp_path / "ok.xml")
    assert case.get("name") == str(ok) and case.find("failure") is None
    rc, shown, _ = kvown(capsys, "check-trace", str(bad), "--junit", str(tmp_path / "bad.xml"))
    assert rc == 1
    (case,) = cases(tmp_path / "bad.xml")
    failure = case.find("failure")
    assert failure is not None and failure.text and failure.text.strip() == shown.strip()


def test_prove_junit_one_testcase_per_claim(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "prove.xml"
    argv = ("prove", "--only", "layout", "--quick", "--jobs", "1", "--json", "--junit", str(out))
    rc, shown, _ = kvown(capsys, *argv)
    claims = json.loads(shown)["claims"]
    got = cases(out)
    assert [c.get("name") for c in got] == [c["id"] for c in claims]
    assert rc == (0 if all(c["ok"] for c in claims) else 1)


BAD_USAGE = [
    ("list", "--frobnicate"),
    ("check", "--config", "nope"),
    ("check", "--mutant", "cancel_ignored", "--dot", "/nonexistent-dir/x.dot"),
    ("check", "--junit", "/"),
    ("check", "--config", "handoff_tp2to1", "--dot", "/tmp/kvown-never-written.dot"),
    ("check-trace", "/nonexistent-dir/log.jsonl"),
    ("check-trace", str(TRACES / "ok_handoff.jsonl"), "--max-gap", "100000"),
    ("check-trace", str(TRACES / "ok_handoff.jsonl"), "--junit", "/nonexistent-dir/j.xml"),
    ("prove", "--jobs", "0"),
    ("prove", "--jobs", "1000000"),
    ("prove", "--junit", "/nonexistent-dir/p.xml"),
    ("prove", "--mutant", "nope"),
    ("demo", "--seed", "100000000000000000000000000"),
    ("demo", "--steps", "0"),
    ("fuzz", "--seconds", "nan"),
    ("fuzz", "--seconds", "-1"),
    ("fuzz", "--examples", "0"),
    ("fuzz", "--junit", "/nonexistent-dir/f.xml"),
    ("repro", "nope"),
    ("repro",),
    ("nope",),
    (),
]


@pytest.mark.parametrize("argv", BAD_USAGE, ids=lambda a: " ".join(a) or "<none>")
@pytest.mark.parametrize("as_json", [False, True])
def test_bad_input_exits_2_with_one_error_line(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], as_json: bool
) -> None:
    full = (*argv, "--json") if as_json and argv and argv[0] not in ("nope",) else argv
    rc, out, err = kvown(capsys, *full)
    assert rc == 2
    lines = err.strip().splitlines()
    if not argv:  # a bare `kvown`: the usage first, as argparse tools do, then the error line
        assert lines[0] == "usage: kvown COMMAND [options]" and "commands:" in lines, err
        lines = lines[-1:]
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert "Traceback" not in err
    if full != argv:
        assert "error" in json.loads(out)
    else:
        assert out == ""


def test_an_internal_error_never_exits_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvown_cli import listing

    def boom(args: object) -> int:
        raise TypeError("unhashable type: 'list'")

    monkeypatch.setattr(listing, "run", boom)
    rc, out, err = kvown(capsys, "list")
    assert rc == 3
    assert err.strip().splitlines() == [
        "error: kvown list: internal error (a bug in kvown): TypeError: unhashable type: 'list'"
    ]


def test_check_cex_dir_keeps_a_replayable_json_and_a_dot(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from model_checks.explicit.trace import replay
    from spec.config import get_config
    from spec.properties import violated_safety

    rc, _, _ = kvown(
        capsys, "check", "--mutant", "failed_store_visible", "--cex-dir", str(tmp_path)
    )
    assert rc == 1
    (j,) = tmp_path.glob("*.json")
    (d,) = tmp_path.glob("*.dot")
    cex = json.loads(j.read_text())
    assert cex["violated"] == "PublishAfterCommit" and cex["mutants"] == ["failed_store_visible"]
    c = get_config(cex["config"])
    worlds = replay(c, frozenset(cex["mutants"]), cex["trace"])
    assert "PublishAfterCommit" in violated_safety(worlds[-1], c)
    assert d.read_text().startswith("digraph") and d.read_text().count("->") == len(cex["trace"])


def test_fuzz_junit_one_testcase_per_config(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "fuzz.xml"
    argv = ("fuzz", "--config", "offload_contend", "--examples", "3", "--json")
    rc, shown, _ = kvown(capsys, *argv, "--junit", str(out))
    (case,) = cases(out)
    assert case.get("name") == "offload_contend"
    assert rc == (1 if json.loads(shown)["failure"] else 0) == (case.find("failure") is not None)


def test_fuzz_junit_marks_survivors_failed_and_na_skipped(tmp_path: Path) -> None:
    from kvown_cli.fuzz import _kill_case
    from kvown_cli.junit import write_junit
    from refimpl.testing.run import Kill

    kills = [
        Kill("a", "c", True, True, steps=3, examples=2, seconds=1.0),
        Kill("b", "c", True, False, examples=500, seconds=2.0, message="no divergence"),
        Kill("d", "c", False, None, message="not applicable here"),
    ]
    write_junit(str(tmp_path / "k.xml"), "kvown fuzz --mutant", [_kill_case(k) for k in kills])
    a, b, d = cases(tmp_path / "k.xml")
    assert a.find("failure") is None and a.find("skipped") is None
    failure = b.find("failure")
    assert failure is not None and "SURVIVED" in (failure.text or "")
    assert d.find("skipped") is not None and d.find("failure") is None
