//! `clb-watcher` (in progress).

fn main() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}
