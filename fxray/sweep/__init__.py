"""Sweeps on Ray: the object store, FoldWorker actors, leases, trials, the Tune + Optuna + ASHA
driver. The only Ray importer; imports fxray.rl, fxray.track and below; nothing imports it."""
