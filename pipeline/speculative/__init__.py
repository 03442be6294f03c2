"""Speculative decoding modes behind one seam: base.py's protocol, one module per mode, registry.py's lookup
(docs/architecture.md#speculative-decoding-modes)."""
