"""The search (``python -m meta.run``): its command (run), config (config; the schema is meta/settings/), dry-run
plan (plan), the centre's start (init), seeds (seeding), and what every command does around it: one orchestrator per
run dir (lock), what a resume may change (resume), staging and pre-flight before the first submission (staging).
One generation is in generation/ (the state machine, its shape, the quorum clock, early stopping, the live view); the
selection, reporting and export runs after the search are in after/."""
