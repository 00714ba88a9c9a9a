"""The search: the generation state machine (orchestrator), its start (init), seeds (seeding), closing a generation
(generation_close), stopping clear losers (early_stop), what it says while it runs (live_watch), and what every
command does around it: one orchestrator per run dir (lock), what a resume may change (resume), staging and
pre-flight before the first submission (staging)."""
