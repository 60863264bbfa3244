//! Subscription tiers: they gate which agents can be made active and which
//! workspace sources are read.

use serde::{Deserialize, Serialize};
use std::{fmt, str::FromStr};

/// A subscription tier, ordered: community < pro_agent < pro_cloud < lab < enterprise.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// Free; the default.
    #[default]
    Community,
    /// Paid agents.
    ProAgent,
    /// Paid agents and cloud features.
    ProCloud,
    /// Lab: also reads workspace agents and workspace skills.
    Lab,
    /// Everything.
    Enterprise,
}

/// A tier name that is not one of the five.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown tier `{0}` (expected community, pro_agent, pro_cloud, lab or enterprise)")]
pub struct UnknownTier(pub String);

impl Tier {
    /// All tiers, lowest first.
    pub const ALL: [Tier; 5] = [
        Tier::Community,
        Tier::ProAgent,
        Tier::ProCloud,
        Tier::Lab,
        Tier::Enterprise,
    ];

    /// The name used in files and config.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Community => "community",
            Tier::ProAgent => "pro_agent",
            Tier::ProCloud => "pro_cloud",
            Tier::Lab => "lab",
            Tier::Enterprise => "enterprise",
        }
    }
}

impl FromStr for Tier {
    type Err = UnknownTier;
    /// Case-insensitive; `-` and `_` are the same.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let norm = s.trim().to_ascii_lowercase().replace('-', "_");
        Tier::ALL
            .into_iter()
            .find(|t| t.as_str() == norm)
            .ok_or_else(|| UnknownTier(s.to_string()))
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_and_names() {
        assert!(Tier::Community < Tier::ProAgent && Tier::ProAgent < Tier::ProCloud);
        assert!(Tier::ProCloud < Tier::Lab && Tier::Lab < Tier::Enterprise);
        assert_eq!("Pro-Cloud".parse::<Tier>().unwrap(), Tier::ProCloud);
        for t in Tier::ALL {
            assert_eq!(t.as_str().parse::<Tier>().unwrap(), t);
        }
        assert!("gold".parse::<Tier>().is_err());
    }
}
