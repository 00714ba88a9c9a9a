"""The parts of the outer loop's configuration that every command shares: the schema (the one home of each key's
type, default and range), the keys that define what a run computes and its hash, the path keys made absolute, and
a member's expected time, and the reevaluate node resolved. A search's config object is the schema's SearchSchema
itself; meta/search/config.py build_search_config reads a config through it and adds the checks that need the
search's own modules."""
