"""The z3 side of ``spec.behaviours``: one module per behaviour, mirroring its actions."""

__all__: list[str] = ["identity"]
