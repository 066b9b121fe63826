"""Market data: the fxcache format, the column schema, bar readers, causal features, the
synthetic market and walk-forward folds. Imports nothing else of fxray (the lowest layer)."""
