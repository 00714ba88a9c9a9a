"""What the tasks share: reading data files in the hub's formats, splitting them, and pulling code and numbers out of
completions. A task module is one entry of the registry (inner_loop/tasks/__init__.py); these are its tools."""
