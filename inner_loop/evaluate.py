"""``python -m inner_loop.evaluate work_dir=<run> task=<group> [task.<key>=<value> ...]``: the door of
inner_loop/training/evaluate.py (a finished run scored on a task's test split)."""
from inner_loop.training.evaluate import main

if __name__ == "__main__":
    raise SystemExit(main())
