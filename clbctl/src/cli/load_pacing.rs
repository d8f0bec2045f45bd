//! What the embedded state server's pacing did during `clbctl load`: the subscription's write
//! budget as the server estimated it and the batching window it chose, sampled while the churn
//! runs (the same figures as `clb_server_write_budget_remaining` and
//! `clb_server_batching_window_seconds`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clb_state_server::state::StateServer;
use serde::Serialize;

/// The pacing over the churn.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PacingView {
    /// Samples taken (every 100 ms).
    pub samples: u64,
    /// Share of the samples during which mutating units were paced (0–1).
    pub paced_share: f64,
    /// Widest batching window chosen, ms (`None`: never paced).
    pub window_max_ms: Option<f64>,
    /// Lowest remaining writes the workers reported (`None`: none reported).
    pub remaining_min: Option<u32>,
    /// The last remaining writes reported.
    pub remaining_last: Option<u32>,
}

/// Samples the default gateway every `every` until `stop` turns true.
pub async fn sample(
    server: Arc<StateServer>,
    every: Duration,
    out: Arc<Mutex<PacingView>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut paced = 0u64;
    loop {
        let (window, remaining) = {
            let Some(g) = server.gateways().first() else {
                return;
            };
            let pacing = g.lock().pacing();
            (pacing.batching_window, pacing.remaining_writes)
        };
        {
            let mut v = out
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            v.samples += 1;
            if let Some(w) = window {
                paced += 1;
                let ms = w.as_secs_f64() * 1000.0;
                v.window_max_ms = Some(v.window_max_ms.map_or(ms, |m: f64| m.max(ms)));
            }
            v.paced_share = paced as f64 / v.samples as f64;
            if let Some(r) = remaining {
                v.remaining_min = Some(v.remaining_min.map_or(r, |m| m.min(r)));
                v.remaining_last = Some(r);
            }
        }
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}
