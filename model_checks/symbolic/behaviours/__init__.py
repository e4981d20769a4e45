"""The z3 side of ``spec.behaviours``: the property parts and inductive conjuncts each
behaviour adds (its actions are traced from the spec: ``symbolic.trace``)."""

__all__ = ["async_steps", "decode_failure", "retract", "identity"]
