"""Streamed offers, layer by layer (``Config.layers``; issue #30 item 2).

``layers`` holds the actions (a copy per layer at ``send_layer``, the source freed
early, decode's staging, install and per-layer ready) and the state predicates the
properties read; ``worlds`` the streamed worlds, registered by ``spec/config.py``.
"""

__all__ = ["layers", "worlds"]
