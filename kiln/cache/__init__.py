"""The content-addressed artifact store: local under KILN_CACHE_DIR, remote on fsspec.

An action key (see ``action.py``) maps to the digests of the outputs it
made; the outputs live by the sha256 of their bytes. Nothing here imports
numpy or the stages: a cache hit costs file reads and hashing only.
"""
