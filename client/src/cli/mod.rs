//! `clbctl` subcommands (in progress).
