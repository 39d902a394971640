"""The studies: each names its config, its cells, how one cell runs and its
tables (a :class:`~ada_loss.experiment.runner.Study`); ``experiments/*.py``
run them through :func:`ada_loss.experiment.runner.main`."""
