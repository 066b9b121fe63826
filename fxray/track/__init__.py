"""Records of a sweep: the fold record and what is derived from it (folds.jsonl, results.json,
folds.csv, MLflow runs). Imports fxray.data and fxray.eval; MLflow only, never Ray."""
