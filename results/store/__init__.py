"""The run directory's I/O: its layout, the run store, a member's own files, atomic writes, provenance.

The shared kernel that once lived here is in core/; its old paths still import (pickled jobs and results of a search
started before the move name them)."""
from core import alias_moved

#: old path -> new path of every module that left this package (in meta/settings/upgrade.py's registry of stored
#: names, under its rule for when an alias may go). The config nodes' module (results.store.config_nodes, then
#: core.config_nodes) is not here: split by topic into core/config/, it held functions and constants alone, which no
#: queued job's pickle (the member callable, its entry point string, a spec dict) and no result (a dict) names.
MOVED = {
    "results.store.records": "core.records",
    "results.store.entry_points": "core.entry_points", "results.store.file_lock": "core.file_lock",
    "results.store.proc_stat": "core.proc_stat", "results.store.gpu_time": "core.gpu_time",
    "results.store.notice_window": "core.notice_window", "results.store.stage_pins": "core.stage_pins",
    "results.store.metric_keys": "core.keys", "results.store.member_keys": "core.keys",
    "results.store.progress": "results.store.member_files", "results.store.intermediate": "results.store.member_files",
}
alias_moved(MOVED)
