"""Streamed offers, layer by layer (``Config.layers``): ``spec/stream/layers.py``."""
