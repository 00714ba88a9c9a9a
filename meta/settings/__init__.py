"""The parts of the outer loop's configuration that every command shares: the schema (the one home of each key's
type, default and range), the keys that define what a run computes and its hash, the path keys made absolute, and
a member's expected time. meta/search/config.py builds a search's validated config from them."""
