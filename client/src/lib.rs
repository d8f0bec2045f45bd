//! clb client; the typed client, clbctl and the watcher arrive with the client issue.
