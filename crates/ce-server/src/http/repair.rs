//! The repair routes (admin only; docs/repair.md): `POST /v1/repair/dead` and
//! `POST /v1/repair/reconcile`, each with a JSON body (see
//! [`crate::engine::repair::DeadRepairBody`] and [`crate::engine::repair::ReconcileBody`]).

use axum::extract::State;

use super::AppState;
use super::handlers::{Answer, J, blocking, body};
use crate::engine::repair::{DeadRepairBody, ReconcileBody};

/// `POST /v1/repair/dead` `{"action": "count"|"requeue"|"force_done", "filter": {...},
/// "confirm": bool}`.
pub async fn dead(State(s): State<AppState>, b: J<DeadRepairBody>) -> Answer {
    let b = body(b)?;
    blocking(&s, move |e| Ok(e.repair_dead(&b)?)).await
}

/// `POST /v1/repair/reconcile` `{"consumer", "subtree", "dry_run", "allow_large_delete"}`
/// (all optional; `{}` reconciles every index over the whole store).
pub async fn reconcile(State(s): State<AppState>, b: J<ReconcileBody>) -> Answer {
    let b = body(b)?;
    blocking(&s, move |e| Ok(e.reconcile(&b)?)).await
}
