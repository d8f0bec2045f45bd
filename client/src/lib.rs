//! clb client: the typed gRPC client of the state server and the builders of updates.
//!
//! - [`client`]: [`client::Client`] (connect with retry, optional TLS, Admin reads) and
//!   [`client::Writer`] (single updates, bulk streaming, resync);
//! - [`updates`]: builders of `clb.v1` updates;
//! - [`tls`]: TLS to the state server verified against a CA bundle file re-read when it changes,
//!   and the rule that a token never crosses the network in clear;
//! - [`token`]: the bearer token every call sends, read from a file and re-read when it rotates;
//! - [`backoff`]: the one retry policy (backon's exponential backoff with equal jitter) of the
//!   client, the watcher and the sync worker.
//!
//! The watcher and node agent (`clb-watcher`), `clbctl` and the embedded system (`clb-embedded`) are
//! crates of their own that use this one.

pub mod backoff;
pub mod client;
pub mod tls;
pub mod token;
pub mod updates;

pub use client::{Client, ClientError, ConnectOptions, Writer};
