"""Autotuning: measure kernel configurations on this device and remember the winners on disk."""

from netcl.kernels.tuning import TuningDatabase, database_for, lookup
from netcl.tune.tuner import Candidate, TuneResult, tune_family

__all__ = ["Candidate", "TuneResult", "TuningDatabase", "database_for", "lookup", "tune_family"]
