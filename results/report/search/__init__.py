"""The report of an ES search: its snapshot (a tolerant read of the run dir), tables, plots, the paper's result
table and the TensorBoard scalars."""
