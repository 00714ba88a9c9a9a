"""The TRL vocabulary the run config is checked against and the trainer is built from: which GRPOConfig field each of
our keys sets (fields.py), train.trl checked against GRPOConfig (trl_overrides.py), and what TRL's loss reads that we
support or refuse (trl_contract.py). Below both the config and the trainer, so each imports it and neither the other.
"""
