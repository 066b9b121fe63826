"""fxray: walk-forward DQN trading research with the dataset resident on the GPU."""

__version__ = "0.1.0"
