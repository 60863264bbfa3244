//! The authenticated caller at the client edge.

use omicos_proto::PermissionMode;

/// How a principal proved who it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// An API key from config (or the laptop token).
    ApiKey,
    /// A JWT verified against the JWKS.
    Jwt,
    /// Authentication is switched off (`auth.enabled: false`, `omicos up --no-auth`).
    Disabled,
    /// Forwarded by an authenticated orchestrator to a runner.
    Forwarded,
}

/// Who is calling: what sessions it owns (tenant + subject), which agents and
/// skills it may use (tier) and the most permissive mode it may ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// The subject: an API key's principal name, a JWT's `sub`.
    pub subject: String,
    /// The tenant; sessions, workspaces and memory are per tenant.
    pub tenant: String,
    /// The tier; empty: the deployment's.
    pub tier: String,
    /// The most permissive mode this principal may use.
    pub max_mode: PermissionMode,
    /// How it was proved.
    pub via: Via,
}

impl Principal {
    /// The principal every caller is when authentication is off: the default
    /// tenant, the deployment's tier, any mode.
    pub fn anonymous() -> Self {
        Self {
            subject: crate::config::LOCAL_SUBJECT.into(),
            tenant: crate::config::DEFAULT_TENANT.into(),
            tier: String::new(),
            max_mode: PermissionMode::Full,
            via: Via::Disabled,
        }
    }

    /// `asked`, lowered to this principal's ceiling (an unspecified ask stays
    /// unspecified: the service's default applies, and is capped too by [`Self::cap_default`]).
    pub fn cap(&self, asked: PermissionMode) -> PermissionMode {
        if asked.rank() > self.max_mode.rank() {
            self.max_mode
        } else {
            asked
        }
    }

    /// The mode a request gets: `asked`, or `default` when unspecified, capped.
    pub fn cap_default(&self, asked: PermissionMode, default: PermissionMode) -> PermissionMode {
        self.cap(asked.or(default))
    }

    /// The mode of a request from this principal: what it asked, lowered to
    /// the ceiling. An unspecified ask under a ceiling below full becomes the
    /// ceiling, so a service default above it cannot apply.
    pub fn ceiling_mode(&self, asked: PermissionMode) -> PermissionMode {
        if asked == PermissionMode::Unspecified && self.max_mode != PermissionMode::Full {
            return self.max_mode;
        }
        self.cap(asked)
    }

    /// A legacy switch (`allow_shell`, `allow_file_write`) from this
    /// principal: `true` runs the tool without asking, which only a full
    /// ceiling permits, so below it a `true` is dropped (the mode decides);
    /// `false` only restricts and always stays.
    pub fn ceiling_switch(&self, asked: Option<bool>) -> Option<bool> {
        match asked {
            Some(true) if self.max_mode != PermissionMode::Full => None,
            other => other,
        }
    }

    /// Whether `(tenant, subject)` are this principal's: a session belongs to
    /// its creator's tenant and subject.
    pub fn owns(&self, tenant: &str, subject: &str) -> bool {
        self.tenant == tenant && self.subject == subject
    }

    /// For logs: `subject@tenant`.
    pub fn label(&self) -> String {
        format!("{}@{}", self.subject, self.tenant)
    }
}

/// The principal a request carries, set by [`crate::Guard`]. A request
/// without one reached a service that was built without its guard: that is
/// refused rather than guessed.
pub fn of<T>(req: &tonic::Request<T>) -> Result<Principal, tonic::Status> {
    req.extensions().get::<Principal>().cloned().ok_or_else(|| {
        tonic::Status::unauthenticated("no principal: this service is not behind its guard")
    })
}
