"""The z3 side of ``spec.behaviours``: one module per behaviour, mirroring its actions."""

__all__ = ["async_steps", "decode_failure", "irrevocable", "retract", "decode_ranks", "identity"]
