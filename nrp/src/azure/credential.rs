//! Choosing the Entra ID credential the ARM client gets its bearer tokens from.

use std::fmt;
use std::sync::Arc;

use azure_core::credentials::{Secret, TokenCredential};
use azure_identity::{
    ClientSecretCredential, DeveloperToolsCredential, ManagedIdentityCredential,
    ManagedIdentityCredentialOptions, UserAssignedId, WorkloadIdentityCredential,
};

use crate::NrpError;

/// Which credential authenticates calls to ARM. Every credential caches its tokens and refreshes them
/// before they expire.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum CredentialConfig {
    /// No token (the NRP emulator).
    #[default]
    None,
    /// Entra Workload Identity on Kubernetes: tenant, client id and token file from the environment
    /// (`AZURE_TENANT_ID`, `AZURE_CLIENT_ID`, `AZURE_FEDERATED_TOKEN_FILE`) that the webhook injects.
    WorkloadIdentity,
    /// The managed identity of the VM / VM scale set (IMDS) or App Service.
    ManagedIdentity {
        /// Client id of a user-assigned identity; `None`: the system-assigned identity.
        client_id: Option<String>,
    },
    /// A service principal with a client secret.
    ClientSecret {
        /// Tenant (directory) id.
        tenant_id: String,
        /// Client (application) id.
        client_id: String,
        /// The secret (never printed by `Debug`).
        secret: String,
    },
    /// The developer's `az` / `azd` login (local runs only).
    DeveloperTools,
}

impl fmt::Debug for CredentialConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::WorkloadIdentity => f.write_str("WorkloadIdentity"),
            Self::ManagedIdentity { client_id } => f
                .debug_struct("ManagedIdentity")
                .field("client_id", client_id)
                .finish(),
            Self::ClientSecret {
                tenant_id,
                client_id,
                ..
            } => f
                .debug_struct("ClientSecret")
                .field("tenant_id", tenant_id)
                .field("client_id", client_id)
                .field("secret", &"<redacted>")
                .finish(),
            Self::DeveloperTools => f.write_str("DeveloperTools"),
        }
    }
}

impl CredentialConfig {
    /// A stable name of the kind of credential, for logs and flags
    /// (`none`, `workload-identity`, `managed-identity`, `client-secret`, `developer-tools`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::WorkloadIdentity => "workload-identity",
            Self::ManagedIdentity { .. } => "managed-identity",
            Self::ClientSecret { .. } => "client-secret",
            Self::DeveloperTools => "developer-tools",
        }
    }

    /// Builds the credential (`None` for [`CredentialConfig::None`]). Fails with
    /// [`NrpError::Auth`] (code `CredentialUnavailable`) when the configuration is incomplete, e.g.
    /// workload identity without its environment.
    pub fn build(&self) -> Result<Option<Arc<dyn TokenCredential>>, NrpError> {
        let unavailable = |err: azure_core::Error| NrpError::Auth {
            code: "CredentialUnavailable".into(),
            message: format!("{} credential: {err}", self.kind()),
        };
        let credential: Arc<dyn TokenCredential> = match self {
            Self::None => return Ok(None),
            Self::WorkloadIdentity => WorkloadIdentityCredential::new(None).map_err(unavailable)?,
            Self::ManagedIdentity { client_id } => {
                ManagedIdentityCredential::new(Some(ManagedIdentityCredentialOptions {
                    user_assigned_id: client_id.clone().map(UserAssignedId::ClientId),
                    ..Default::default()
                }))
                .map_err(unavailable)?
            }
            Self::ClientSecret {
                tenant_id,
                client_id,
                secret,
            } => ClientSecretCredential::new(
                tenant_id,
                client_id.clone(),
                Secret::new(secret.clone()),
                None,
            )
            .map_err(unavailable)?,
            Self::DeveloperTools => DeveloperToolsCredential::new(None).map_err(unavailable)?,
        };
        Ok(Some(credential))
    }
}
