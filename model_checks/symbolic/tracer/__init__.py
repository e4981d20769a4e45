"""The tracer: the spec's Python actions run on symbolic values (``symstate``), once per
path (``oracle``), into the z3 ``Rules`` that BMC and the induction consume (``trace``)."""

from model_checks.symbolic.tracer.oracle import paths
from model_checks.symbolic.tracer.trace import traced, traced_global

__all__ = ["paths", "traced", "traced_global"]
