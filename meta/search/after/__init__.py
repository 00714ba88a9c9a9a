"""After the search: re-evaluation's selection stage (reevaluate), the result table's reporting runs (reporting) and
its rows (baselines), a batch of member runs outside the generations (phase), and the exported init (export)."""
