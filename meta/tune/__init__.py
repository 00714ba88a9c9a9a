"""``python -m meta.tune``: Optuna over the inner run's hyperparameters, every trial's runs submitted as members.

Modules: space (tune.space -> a trial's overrides), config (conf/tune.yaml read through TuneSchema and checked up front;
the study's space), trials (trial.json and its member specs), tuner (the ask / run / prune / tell loop and its resume), export (the best trial as a preset),
plan (the dry run), cli (the command), synthetic (a stand-in objective for tests and benchmarks).
"""
