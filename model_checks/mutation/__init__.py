"""One-edit mutants of Python source, and a runner that judges each in its own process.

Stdlib only (``ast``, ``difflib``, ``subprocess``, ``concurrent.futures``): no torch, so
every target can use it. A *target* is a set of source files plus the checks to run on
each mutant; ``kvown mutate --target refimpl`` is one (``refimpl/testing/mutate.py``).

A target (``target.Target``) bundles the files, the checks, the copy list, the reviewed
equivalents file and the excluded scopes; ``kvown mutate --target NAME`` runs one (see
``target.py`` for how to add a target). Generate, sample, run, summarise by hand::

    from model_checks.mutation import Check, generate, run_mutants, sample, summarise
    ms = generate(root, ["refimpl/blocks.py"])          # every one-edit mutant, stable ids
    ms = sample(ms, 30, seed=0)                         # the same 30 on every run
    checks = [Check("fuzz", ("python", "-m", "my.fuzz_entry"), timeout_s=120)]
    results = run_mutants(root, ms, checks, copy=["spec", "refimpl"], jobs=2)
    report = summarise(results, load_equivalents(path))  # the --json shape

How a mutant is judged: ``root``'s folders named in ``copy`` are copied once per worker
into a temporary directory, the mutant's file is overwritten there, and each check runs
as ``argv`` with that directory as its working directory and first on ``PYTHONPATH``.
Exit status 0 means the check passed (the mutant *survived* it), any other status means
it was *killed*, and running past ``timeout_s`` is a *timeout* (the process group is
ended). A mutant is killed when any check that counts kills it (``Check.counts``).

Operators (``operators.OPERATORS``): ``drop_conjunct`` / ``drop_disjunct`` (one operand
of ``and``/``or``), ``negate_compare`` (``==``→``!=``, ``<``→``>=``, ``in``→``not in``...),
``flip_boundary`` (``<``↔``<=``, ``>``↔``>=``), ``drop_not``, ``shift_const`` (an int
constant ±1), ``flip_bool`` (``True``↔``False``), ``drop_assign`` / ``drop_call`` /
``drop_raise`` / ``drop_return`` (the statement becomes ``pass``), ``swap_stmts`` (two
adjacent simple statements). Each edit replaces exact source spans, so the diff shows
the one change. A line holding ``# no-mutate`` is skipped, and so are docstrings,
annotations, ``__all__``, ``__repr__``/``__str__`` and anything under ``TYPE_CHECKING``.

Mutant ids are stable across edits elsewhere in the file: ``<stem>.<qualname>:<op>:<h>``
where ``h`` hashes the file, the enclosing function, the operator, the original and
mutated text and the occurrence number (not the line number).
"""

from model_checks.mutation.equivalents import load_equivalents
from model_checks.mutation.operators import OPERATORS, Mutant, generate, generate_file, sample
from model_checks.mutation.runner import Check, MutantResult, run_mutants, summarise
from model_checks.mutation.target import Target, python_files

__all__ = [
    "OPERATORS",
    "Check",
    "Target",
    "Mutant",
    "MutantResult",
    "generate",
    "generate_file",
    "load_equivalents",
    "python_files",
    "run_mutants",
    "sample",
    "summarise",
]
