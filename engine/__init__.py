"""The speculative-decoding engine under evaluation: models, caches, drafters, decoding."""
