"""Reading config as data, one module per fact: a member's horizon (horizon.py), plain data and unknown keys
(plain_data.py), dotted keys (dotted_keys.py), the config trees, groups and overrides (groups.py), typed nodes and
schema errors (typed_nodes.py). Each imports only the standard library and its neighbours here.
"""
