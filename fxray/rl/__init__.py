"""Training on one device: configs, the resident dataset, the env, replay, learners, the
fold trainer, experiment files. Imports fxray.data and fxray.eval; never Ray or MLflow."""
