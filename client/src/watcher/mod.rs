//! The kube watcher and node agent (in progress).
