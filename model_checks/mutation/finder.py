"""The AST walk that finds every one-edit mutation of a module, as byte-span edits.

``Finder(src, switches).visit(tree)`` fills ``edits``; ``operators.generate_file`` turns
them into ``Mutant`` records. What is skipped, and why, is in the package docstring.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

NO_MUTATE = "# no-mutate"
_SKIP_FUNCS = frozenset({"__repr__", "__str__", "__rich__", "__format__"})
_NEGATE: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_BOUNDARY: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
}
_LOOSE = (ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr)  # need parentheses alone
_SIMPLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Raise, ast.Return)


@dataclass(frozen=True)
class Edit:
    op: str
    qualname: str
    line: int
    spans: tuple[tuple[int, int, str], ...]  # (start byte, end byte, new text), disjoint


class Finder(ast.NodeVisitor):
    """Walks one module and collects the edits (as byte spans of the UTF-8 source)."""

    def __init__(self, src: bytes, switches: frozenset[str] = frozenset()) -> None:
        self.src = src
        self.switches = switches
        self.lines = src.splitlines(keepends=True)
        self.starts = [0]
        for ln in self.lines:
            self.starts.append(self.starts[-1] + len(ln))
        self.scope: list[str] = []
        self.edits: list[Edit] = []

    # --- positions --------------------------------------------------------------------
    def span(self, n: ast.AST) -> tuple[int, int]:
        lo = self.starts[n.lineno - 1] + n.col_offset  # type: ignore[attr-defined]
        hi = self.starts[n.end_lineno - 1] + n.end_col_offset  # type: ignore[attr-defined]
        return lo, hi

    def text(self, n: ast.AST) -> str:
        lo, hi = self.span(n)
        return self.src[lo:hi].decode()

    def skipped(self, n: ast.AST) -> bool:
        first, last = n.lineno, n.end_lineno or n.lineno  # type: ignore[attr-defined]
        return any(NO_MUTATE in self.lines[i - 1].decode() for i in range(first, last + 1))

    def add(self, op: str, n: ast.AST, new: str) -> None:
        if self.skipped(n):
            return
        lo, hi = self.span(n)
        self.edits.append(Edit(op, ".".join(self.scope), n.lineno, ((lo, hi, new),)))  # type: ignore[attr-defined]

    # --- scopes and skips -------------------------------------------------------------
    def visit_FunctionDef(self, n: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if n.name in _SKIP_FUNCS:
            return
        self.scope.append(n.name)
        for a in (*n.args.defaults, *n.args.kw_defaults):
            if a is not None:
                self.visit(a)
        self.body(n.body, function=True)
        self.scope.pop()

    def visit_AsyncFunctionDef(self, n: ast.AsyncFunctionDef) -> None:
        self.visit_FunctionDef(n)

    def visit_ClassDef(self, n: ast.ClassDef) -> None:
        self.scope.append(n.name)
        self.body(n.body, declarations=True)
        self.scope.pop()

    def visit_Module(self, n: ast.Module) -> None:
        self.body(n.body, declarations=True)

    def visit_AnnAssign(self, n: ast.AnnAssign) -> None:
        if n.value is not None:
            self.visit(n.value)

    def visit_arg(self, n: ast.arg) -> None:
        return  # annotations

    def visit_JoinedStr(self, n: ast.JoinedStr) -> None:
        return  # messages

    def visit_If(self, n: ast.If) -> None:
        t = n.test
        if (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
            isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
        ):
            return
        switch = self.switch_test(t)
        if switch == "on":  # the body runs only with a bug switch on: leave it alone
            self.switch_edits(t)
            self.body(n.orelse)
            return
        self.visit(n.test)
        self.body(n.body)
        if switch != "off":
            self.body(n.orelse)

    def visit_IfExp(self, n: ast.IfExp) -> None:
        switch = self.switch_test(n.test)
        if switch is None:
            self.generic_visit(n)
            return
        self.switch_edits(n.test)
        self.visit(n.orelse if switch == "on" else n.body)

    # --- bug switches -----------------------------------------------------------------
    def is_switch(self, e: ast.expr, op: type[ast.cmpop]) -> bool:
        return (
            isinstance(e, ast.Compare)
            and len(e.ops) == 1
            and isinstance(e.ops[0], op)
            and isinstance(e.left, ast.Constant)
            and e.left.value in self.switches
        )

    def switch_test(self, t: ast.expr) -> str | None:
        """ "on": true only with a switch on (``"x" in m``, or a conjunction with it);
        "off": false only with a switch on (a bare ``"x" not in m``); else None."""
        if self.is_switch(t, ast.In):
            return "on"
        if isinstance(t, ast.BoolOp) and isinstance(t.op, ast.And):
            if any(self.is_switch(v, ast.In) for v in t.values):
                return "on"
        if self.is_switch(t, ast.NotIn):
            return "off"
        return None

    def switch_edits(self, t: ast.expr) -> None:
        """In a switch test, only the edits that turn the switch's code on are live: the
        membership negated, or (in a conjunction) dropped; any other edit leaves the
        switch's code as dead as before."""
        for v in t.values if isinstance(t, ast.BoolOp) else [t]:
            if isinstance(v, ast.Compare) and self.is_switch(v, ast.In):
                self.visit_Compare(v, recurse=False)
        if isinstance(t, ast.BoolOp):
            self.visit_BoolOp(t, only=[self.is_switch(v, ast.In) for v in t.values])

    def body(
        self, stmts: list[ast.stmt], function: bool = False, declarations: bool = False
    ) -> None:
        """``declarations``: a module or class body, whose assignments define names (to
        drop or reorder one only breaks the import: no behaviour to judge)."""
        for i, s in enumerate(stmts):
            if i == 0 and _is_docstring(s):
                continue
            if _is_all(s):
                continue
            if not declarations:
                self.statement(s, function and i == len(stmts) - 1)
            self.visit(s)
            if (  # `if "x" not in m: return/raise`: what follows runs with the switch only
                isinstance(s, ast.If)
                and self.switch_test(s.test) == "off"
                and s.body
                and isinstance(s.body[-1], (ast.Return, ast.Raise))
            ):
                self.swaps(stmts[: i + 1])
                return
        if not declarations:
            self.swaps(stmts)

    # --- statement operators ----------------------------------------------------------
    def statement(self, s: ast.stmt, last_of_function: bool) -> None:
        if isinstance(s, (ast.Assign, ast.AugAssign)) or (
            isinstance(s, ast.AnnAssign) and s.value is not None and s.simple == 0
        ):
            self.add("drop_assign", s, "pass")
        elif isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
            self.add("drop_call", s, "pass")
        elif isinstance(s, ast.Raise):
            self.add("drop_raise", s, "pass")
        elif isinstance(s, ast.Return) and s.value is not None and not last_of_function:
            self.add("drop_return", s, "pass")  # an early return: the guard falls through

    def generic_visit(self, node: ast.AST) -> None:
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.Try)):
            for name in ("target", "iter", "test"):
                sub = getattr(node, name, None)
                if isinstance(sub, ast.AST):
                    self.visit(sub)
            for it in getattr(node, "items", []):
                self.visit(it.context_expr)
            for name in ("body", "orelse", "finalbody"):
                self.body(getattr(node, name, None) or [])
            for h in getattr(node, "handlers", []):
                self.body(h.body)
            return
        super().generic_visit(node)

    def swaps(self, stmts: list[ast.stmt]) -> None:
        for a, b in zip(stmts, stmts[1:], strict=False):
            if not (isinstance(a, _SIMPLE) and isinstance(b, _SIMPLE)):
                continue
            if isinstance(a, (ast.Raise, ast.Return)) or isinstance(b, (ast.Raise, ast.Return)):
                continue
            if _is_docstring(a) or _is_docstring(b) or self.skipped(a) or self.skipped(b):
                continue
            if not _depends(a, b) or _defines_for(a, b):
                continue
            (alo, ahi), (blo, bhi) = self.span(a), self.span(b)
            ta, tb = self.text(a), self.text(b)
            spans = ((alo, ahi, tb), (blo, bhi, ta))
            self.edits.append(Edit("swap_stmts", ".".join(self.scope), a.lineno, spans))

    # --- expression operators ---------------------------------------------------------
    def visit_BoolOp(self, n: ast.BoolOp, only: list[bool] | None = None) -> None:
        op = "drop_conjunct" if isinstance(n.op, ast.And) else "drop_disjunct"
        for i in range(len(n.values)):
            if only is not None and not only[i]:
                continue
            rest = n.values[:i] + n.values[i + 1 :]
            if len(rest) == 1:
                new = ast.unparse(rest[0])
                if isinstance(rest[0], _LOOSE):
                    new = f"({new})"
            else:
                new = ast.unparse(ast.BoolOp(op=n.op, values=rest))
            self.add(op, n, new)
        if only is None:
            self.generic_visit(n)

    def visit_Compare(self, n: ast.Compare, recurse: bool = True) -> None:
        for i, o in enumerate(n.ops):
            for table, name in ((_NEGATE, "negate_compare"), (_BOUNDARY, "flip_boundary")):
                repl = table.get(type(o))
                if repl is None:
                    continue
                ops = list(n.ops)
                ops[i] = repl()
                self.add(name, n, ast.unparse(ast.Compare(n.left, ops, n.comparators)))
        if recurse:
            self.generic_visit(n)

    def visit_UnaryOp(self, n: ast.UnaryOp) -> None:
        if isinstance(n.op, ast.Not):
            new = ast.unparse(n.operand)
            self.add("drop_not", n, f"({new})" if isinstance(n.operand, _LOOSE) else new)
        self.generic_visit(n)

    def visit_Constant(self, n: ast.Constant) -> None:
        if isinstance(n.value, bool):
            self.add("flip_bool", n, str(not n.value))
        elif isinstance(n.value, int):
            self.add("shift_const", n, str(n.value + 1))
            self.add("shift_const", n, f"({n.value - 1})" if n.value - 1 < 0 else str(n.value - 1))


def _is_docstring(s: ast.stmt) -> bool:
    return (
        isinstance(s, ast.Expr)
        and isinstance(s.value, ast.Constant)
        and isinstance(s.value.value, str)
    )


def _is_all(s: ast.stmt) -> bool:
    return isinstance(s, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "__all__" for t in s.targets
    )


def _dotted(n: ast.AST) -> str | None:
    if isinstance(n, ast.Name):
        return n.id
    if isinstance(n, ast.Attribute):
        base = _dotted(n.value)
        return None if base is None else f"{base}.{n.attr}"
    if isinstance(n, ast.Subscript):
        return _dotted(n.value)
    return None


def _effects(s: ast.stmt) -> tuple[set[str], set[str]]:
    """(written, read) names of a simple statement, as dotted paths and their prefixes.
    A call is taken to write its receiver (``a.b.f()`` writes ``a.b``)."""
    written: set[str] = set()
    targets: list[ast.AST] = []
    if isinstance(s, ast.Assign):
        targets = list(s.targets)
    elif isinstance(s, (ast.AugAssign, ast.AnnAssign)):
        targets = [s.target]
    for t in targets:
        for sub in ast.walk(t):
            d = _dotted(sub)
            if d is not None:
                written.add(d)
                break
    read: set[str] = set()
    for sub in ast.walk(s):
        d = _dotted(sub)
        if d is not None:
            parts = d.split(".")
            read.update(".".join(parts[: k + 1]) for k in range(len(parts)))
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
            recv = _dotted(sub.func.value)
            if recv is not None:
                written.add(recv)
    return written, read


def _defines_for(a: ast.stmt, b: ast.stmt) -> bool:
    """Does ``a`` assign a plain local name that ``b`` reads? Swapping them only reads a
    name before its definition (a NameError at once), not a bug worth a mutant."""
    if not isinstance(a, ast.Assign):
        return False
    defined = {n.id for t in a.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    _, rb = _effects(b)
    return bool(defined & rb)


def _depends(a: ast.stmt, b: ast.stmt) -> bool:
    """Whether swapping ``a`` and ``b`` may change behaviour: one writes what the other
    touches (a dotted path or one of its prefixes)."""
    wa, ra = _effects(a)
    wb, rb = _effects(b)

    def hit(w: set[str], other: set[str]) -> bool:
        return any(
            x == y or x.startswith(y + ".") or y.startswith(x + ".") for x in w for y in other
        )

    return hit(wa, rb | wb) or hit(wb, ra)
