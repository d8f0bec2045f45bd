//! ARM long-running operations: the store of operations started in LRO mode, polled through the
//! `Azure-AsyncOperation` (status) and `Location` (result) URLs.

use std::collections::{HashMap, VecDeque};

use axum::http::StatusCode;

use crate::error::EmulatorError;
use clb_nrp::wire::{OperationState, OperationStatus};

/// Finished operations kept for polling (older ones are forgotten).
const KEEP_FINISHED: usize = 100_000;

/// The final outcome of an operation: status and body of the applied call, or its error.
pub(crate) type Outcome = Result<(StatusCode, Option<serde_json::Value>), EmulatorError>;

#[derive(Debug, Clone)]
pub(crate) struct OpRecord {
    pub outcome: Option<Outcome>,
}

#[derive(Debug, Default)]
pub(crate) struct Operations {
    next: u64,
    ops: HashMap<String, OpRecord>,
    finished: VecDeque<String>,
}

impl Operations {
    /// Registers a new in-progress operation and returns its id.
    pub(crate) fn start(&mut self) -> String {
        self.next += 1;
        let id = format!("op-{:08}", self.next);
        self.ops.insert(id.clone(), OpRecord { outcome: None });
        id
    }

    pub(crate) fn finish(&mut self, id: &str, outcome: Outcome) {
        if let Some(op) = self.ops.get_mut(id) {
            op.outcome = Some(outcome);
            self.finished.push_back(id.to_string());
        }
        while self.finished.len() > KEEP_FINISHED {
            if let Some(old) = self.finished.pop_front() {
                self.ops.remove(&old);
            }
        }
    }

    pub(crate) fn get(&self, id: &str) -> Option<&OpRecord> {
        self.ops.get(id)
    }

    pub(crate) fn clear(&mut self) {
        self.ops.clear();
        self.finished.clear();
    }
}

impl OpRecord {
    /// The `Azure-AsyncOperation` body.
    pub(crate) fn status(&self, id: &str) -> OperationStatus {
        let (status, error) = match &self.outcome {
            None => (OperationState::InProgress, None),
            Some(Ok(_)) => (OperationState::Succeeded, None),
            Some(Err(e)) => (OperationState::Failed, Some(e.body().error)),
        };
        OperationStatus {
            id: Some(id.to_string()),
            name: Some(id.to_string()),
            status,
            error,
        }
    }
}
