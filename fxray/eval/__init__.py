"""Judging a policy: the greedy backtest on device, metrics and their statistics, baselines.
Imports fxray.data only (never fxray.rl, Ray or MLflow)."""
