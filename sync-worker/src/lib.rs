//! clb sync worker: executes work units from the state server against Azure NRP (or the NRP emulator).

pub mod cli;

pub mod metrics;

pub mod run;

pub mod worker;

pub use run::run;
