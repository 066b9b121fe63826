"""Using what was learned: the policy bundle, its export, the frozen backtest, the live policy."""
