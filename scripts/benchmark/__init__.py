"""The benchmark's parts; ``scripts/bench.py`` (``make bench``) runs them."""
