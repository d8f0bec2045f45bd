//! `clbctl`, the clb command line, as a library (the binary only parses and runs).
//!
//! - [`demo`]: `clbctl demo`, the README's main job: create → rollout → scale down → delete a
//!   service → node drained, on the embedded system (`clb-embedded`), with progress and a summary.
//! - [`status`]: `clbctl status`, the state server's Admin Status as tables, and the convergence check
//!   through Admin.
//! - [`system`]: what `demo` and `load` drive — the embedded system or an external state server.
//! - [`cli`]: the commands (`status`, `state`, `diff`, `apply`, `demo`, `load`, `completions`), with
//!   `--output table|json`.

pub mod cli;
pub mod demo;
pub mod status;
pub mod system;
