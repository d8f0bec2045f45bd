//! clb state server: owns the DiffTracker (desired vs actual state) per gateway.

pub mod difftracker;
