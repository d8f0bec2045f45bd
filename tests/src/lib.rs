//! End-to-end test support; the end-to-end tests arrive with the sync-worker issue.
